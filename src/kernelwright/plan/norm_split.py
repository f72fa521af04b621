"""A normalization whose result only goes on, through elementwise ops, into a pool, as its
statistics and a pointwise apply: training-mode batch norms, layer norms and group norms.

As one normalization group, the norm writes its full-size result and the pool reads it back. Split
into its statistics (mean and biased variance over the normalized dims: one reduction kernel) and
y = (x - mean) * rsqrt(var + eps) * weight + bias, the apply is pointwise: it joins the elementwise
ops after it, which the pool chain (plan.PoolChain) then computes as the pool's prologue, so the
normalized tensor is never written (a ResNet stem in training mode; KernelBench's convolution +
norm + pool problems). Exact in real arithmetic; float32 inputs only. A training batch norm whose
result goes on through elementwise ops into a convolution is split alike where its per-channel
rows are too long for one pass (`CONV_SPLIT_MIN_ROW`): its apply, per-channel statistics and all,
is a pointwise group the convolution kernel can compute as the prologue of its loads
(codegen/conv_epilogue.py), as in the conv - batch norm - ReLU - conv layers of ResNets and
DenseNets in training mode.

- Batch norm (training): statistics per channel over (N, spatial). The running statistics and
  the saved mean and inverse deviation keep their names and are computed as ATen computes them
  (the running variance from the unbiased variance), so buffer updates and every reader are
  unchanged.
- Layer norm: statistics per row over the trailing normalized dims; mean and rstd broadcast over
  them as operands of the apply.
- Group norm: statistics per (sample, group) over a [N, G, C/G, spatial...] view of the input (a
  split of the channel dim: a view in either layout); the per-(sample, channel) mean and scale
  the apply reads are [N, C] values made from them (tiny), so the apply stays one pointwise op
  over the input's own domain.

The norm's input must come from a kernel of its own (a convolution), so that the statistics and the
apply both read it: an elementwise op before it would otherwise be written out for the apply to
read. Adds of a value constant over the normalized dims (a convolution's split-off bias before a
batch or layer norm, a scalar) are the exception: the statistics of t + b are those of t with the
mean moved by b, and the normalized values are those of t, so both read t and b only enters the
saved (and running) mean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, rebuilt
from kernelwright.capture.shapes import strides_ordered_like
from kernelwright.ops import POINTWISE
from kernelwright.plan.fusion import feeds_conv, feeds_pool

_BN = "aten._native_batch_norm_legit_functional.default"
# Per-channel rows longer than this (batch x spatial elements) are split before a convolution: a
# normalization kernel reads rows up to this long once (space/group_space.py's one-pass schedule),
# where the split would add a read when the convolution does not take the apply in.
CONV_SPLIT_MIN_ROW = 16384
_LN = "aten.native_layer_norm.default"
_GN = "aten.native_group_norm.default"


@dataclass
class _Match:
    items: dict  # output index -> the getitem reading it
    source: str  # the value the statistics and the apply read
    shifts: list[str]  # values added to `source` before the norm (constant over the normalized dims)
    dims: list[int]  # the normalized dims of `source` (of its group view, for a group norm)
    recompute: tuple | None = None  # (u, c): `source` = u + c, added again by each of its readers


def _elementwise(graph: Graph, v: str) -> bool:
    return not graph.is_input(v) and graph.node(v).target in POINTWISE


def _constant_over(graph: Graph, b: str, x: TensorMeta, dims: list[int]) -> bool:
    """Whether value `b`, broadcast against `x`, is constant over `dims` of `x`."""
    bm = graph.meta(b)
    if bm is None or len(bm.shape) > len(x.shape):
        return False
    shape = (1,) * (len(x.shape) - len(bm.shape)) + tuple(bm.shape)
    return all(shape[d] == 1 for d in dims) and all(s in (1, n) for s, n in zip(shape, x.shape))


def _broadcast_add(graph: Graph, x: str, reader: str) -> tuple[str, str] | None:
    """(t, b) when `x` = t + b, b a smaller value broadcast over t, and `reader` its only reader."""
    if graph.is_input(x) or x in graph.outputs or [u.name for u in graph.users(x)] != [reader]:
        return None
    add = graph.node(x)
    if add.target != "aten.add.Tensor" or len(add.args) != 2 or add.kwargs or not all(isinstance(a, Ref) for a in add.args):
        return None
    t, b = add.args[0].name, add.args[1].name
    tm, bm, xm = graph.meta(t), graph.meta(b), graph.meta(x)
    if tm is None or bm is None or tuple(tm.shape) != tuple(xm.shape) or bm.numel >= xm.numel:
        return None
    return t, b


def _source(graph: Graph, x: str, reader: str, dims: list[int]) -> tuple[str, list[str], tuple | None] | None:
    """(t, [b, ...], recompute) where `x` = t + b + ... by adds of values constant over `dims`
    (each add read only by the next, the first only by `reader`) and t comes from a kernel of its
    own; or, where t = u + c with c broadcast but not constant over `dims` (a convolution's bias
    before a group norm), recompute = (u, c): the statistics and the apply each add c to u as they
    read it, so neither reads a written t. None otherwise."""
    shifts: list[str] = []
    meta = graph.meta(x)
    while (add := _broadcast_add(graph, x, reader)) is not None and _constant_over(graph, add[1], meta, dims):
        shifts.append(add[1])
        reader, x = x, add[0]
    if not _elementwise(graph, x):
        return x, shifts, None
    # (`add`: the loop's last look, an add not constant over `dims`, or None)
    if add is None or _elementwise(graph, add[0]):
        return None
    return x, shifts, add


def _getitems(graph: Graph, n: OpNode) -> dict | None:
    items = {}
    for u in graph.users(n.name):
        if u.target != "getitem" or u.name in graph.outputs:
            return None
        items[u.args[1]] = u
    x = graph.meta(n.args[0].name)
    long_rows = x is not None and x.numel // max(x.shape[1], 1) > CONV_SPLIT_MIN_ROW
    feeds = 0 in items and (feeds_pool(graph, items[0].name)
                            or (n.target == _BN and long_rows and feeds_conv(graph, items[0].name)))
    return items if feeds and n.name not in graph.mutations else None


def _match(graph: Graph, n: OpNode) -> _Match | None:
    """The split of `n` (module docstring) when it is a norm of a float32 [N, C, spatial...] value
    whose result feeds a pool (plan.fusion.feeds_pool), or a training batch norm whose result feeds
    a convolution (feeds_conv), read only through getitems; else None."""
    if n.target not in (_BN, _LN, _GN) or not n.args or not isinstance(n.args[0], Ref):
        return None
    x = graph.meta(n.args[0].name)
    if x is None or x.dtype != "float32" or len(x.shape) < 3:
        return None
    rank = len(x.shape)
    if n.target == _BN:
        if len(n.args) < 8 or n.args[5] is not True or any(not isinstance(a, (Ref, type(None))) for a in n.args[1:3]) \
                or not (isinstance(n.args[3], Ref) and isinstance(n.args[4], Ref)):
            return None
        dims = [0] + list(range(2, rank))
    elif n.target == _LN:
        if len(n.args) != 5 or any(not isinstance(a, (Ref, type(None))) for a in n.args[2:4]):
            return None
        dims = list(range(rank - len(n.args[1]), rank))
        if 1 in dims:  # (over the channels too: the pool's prologue would read a per-pixel statistic)
            return None
    else:
        if len(n.args) != 8 or any(not isinstance(a, (Ref, type(None))) for a in n.args[1:3]) \
                or x.shape[1] % int(n.args[6]):
            return None
        dims = list(range(rank))  # (shifts: scalars only, constant within every group)
    items = _getitems(graph, n)
    if items is None:
        return None
    found = _source(graph, n.args[0].name, n.name, dims)
    if found is None:
        return None
    source, shifts, recompute = found
    return _Match(items, source, shifts, list(range(2, rank + 1)) if n.target == _GN else dims, recompute)


def split_norms_before_pools(graph: Graph) -> tuple[Graph, list[str]]:
    """Each batch (training), layer or group norm that feeds a pool (`_match`) as its statistics
    and a pointwise apply (module docstring)."""
    found = {n.name: m for n in graph.nodes if (m := _match(graph, n)) is not None}
    if not found:
        return graph, []
    notes: list[str] = []

    def lower(n: OpNode, m: _Match, nodes: list[OpNode]) -> None:
        items = m.items
        xm = graph.meta(m.source)
        full = items[0].meta

        def op(name, target, args, meta, kwargs=None):
            nodes.append(OpNode(name, target, tuple(args), kwargs or {}, [meta]))
            return Ref(name)

        def read(suffix):  # the source, for one of its two readers (recomputed for each: m.recompute)
            if m.recompute is None:
                return Ref(m.source)
            return op(f"{n.name}_{suffix}", "aten.add.Tensor", tuple(map(Ref, m.recompute)), xm)

        x = read("input")

        def shifted(mean, meta):  # the mean of t + b + ...: the shifts added to t's
            for k, b in enumerate(m.shifts):
                shift = Ref(b)
                bm = graph.meta(b)
                if tuple(bm.shape) != tuple(meta.shape) and bm.numel == meta.numel:  # ([C, 1, 1] as the statistics'
                    # [1, C, 1, 1]: an operand of the statistics' own shape, which their reduction kernel reads)
                    shift = op(f"{n.name}_shift{k or ''}", "aten.view.default", (shift, list(meta.shape)),
                               TensorMeta.dense(meta.shape, bm.dtype))
                mean = op(f"{n.name}_mean_shifted{k or ''}", "aten.add.Tensor", (mean, shift), meta)
            return mean

        def stats(source, dims, meta):
            mean = op(f"{n.name}_mean", "aten.mean.dim", (source, dims, True), meta)
            var = op(f"{n.name}_var", "aten.var.correction", (source, dims), meta, {"correction": 0, "keepdim": True})
            eps = float(n.args[7] if n.target in (_BN, _GN) else n.args[4])
            rstd = op(f"{n.name}_rstd", "aten.rsqrt.default", [op(f"{n.name}_var_eps", "aten.add.Tensor", (var, eps), meta)],
                      meta)
            return mean, var, rstd

        def apply(mean, scale, w, b, shape):
            """items[0] = (x - mean) * scale [* w] [+ b], `w` and `b` viewed as `shape` when given."""
            y = op(f"{n.name}_centred", "aten.sub.Tensor", (x, mean), full)
            y = op(f"{n.name}_normed" if (w or b) else items[0].name, "aten.mul.Tensor", (y, scale), full)
            if w is not None:
                w = op(f"{n.name}_weight", "aten.view.default", (w, shape), TensorMeta.dense(shape, "float32")) if shape else w
                y = op(f"{n.name}_scaled" if b else items[0].name, "aten.mul.Tensor", (y, w), full)
            if b is not None:
                b = op(f"{n.name}_bias", "aten.view.default", (b, shape), TensorMeta.dense(shape, "float32")) if shape else b
                op(items[0].name, "aten.add.Tensor", (y, b), full)

        if n.target == _BN:
            _, w, b, rm, rv = n.args[:5]
            C, rank = xm.shape[1], len(xm.shape)
            row = TensorMeta.dense((1, C) + (1,) * (rank - 2), "float32")
            vec = TensorMeta.dense((C,), "float32")
            mean, var, rstd = stats(read("input_stats"), m.dims, row)
            batch_mean = shifted(mean, row)
            apply(mean, rstd, w, b, [C] + [1] * (rank - 2))
            for k, (v, meta) in {1: (batch_mean, vec), 2: (rstd, vec)}.items():
                if k in items:
                    op(items[k].name, "aten.view.default", (v, [C]), meta)
            momentum, count = float(n.args[6]), math.prod(xm.shape) // C
            for k, (stat, running, scale) in {3: (batch_mean, rm, 1.0), 4: (var, rv, count / max(count - 1, 1))}.items():
                if k in items:
                    batch = op(f"{items[k].name}_batch", "aten.view.default", (stat, [C]), vec)
                    new = op(f"{items[k].name}_new", "aten.mul.Tensor", (batch, momentum * scale), vec)
                    # momentum * batch statistic + (1 - momentum) * running, in the statistics' kernel
                    op(items[k].name, "aten.add.Tensor", (new, running), vec, {"alpha": 1.0 - momentum})
            what = "training batch norm"
        elif n.target == _LN:
            shape = tuple(1 if d in m.dims else s for d, s in enumerate(xm.shape))
            # statistics laid out like the input (channels innermost for a channels-last convolution's
            # result), so the kernel that writes them and the apply that reads them per element both
            # walk them in the input's order; the saved mean and rstd the model returns stay dense
            row = TensorMeta.dense(shape, "float32") if 1 in items or 2 in items else \
                TensorMeta(shape, strides_ordered_like(shape, xm.stride), "float32")
            mean, _, rstd = stats(read("input_stats"), m.dims, row)
            apply(mean, rstd, n.args[2], n.args[3], None)  # (w and b have the normalized shape: they broadcast)
            for k, v in {1: shifted(mean, row) if 1 in items else None, 2: rstd}.items():
                if k in items:
                    op(items[k].name, "aten.view.default", (v, list(row.shape)), row)
            what = "layer norm"
        else:
            N, C, G = xm.shape[0], xm.shape[1], int(n.args[6])
            K, spatial = C // G, list(xm.shape[2:])
            grouped = TensorMeta((N, G, K, *spatial), (xm.stride[0], K * xm.stride[1], *xm.stride[1:]), "float32")
            g5 = op(f"{n.name}_grouped", "aten.view.default", (read("input_stats"), [N, G, K] + spatial), grouped)
            row = TensorMeta.dense((N, G, 1) + (1,) * len(spatial), "float32")
            mean, _, rstd = stats(g5, m.dims, row)
            per_group, per_channel = TensorMeta.dense((N, G, 1), "float32"), TensorMeta.dense((N, G, K), "float32")
            nc = [N, C] + [1] * len(spatial)
            nc_meta = TensorMeta.dense(nc, "float32")

            def channels(v, name, w=None):  # a [N, G, ...] statistic as [N, C, 1, ...] (times w)
                v = op(f"{name}_g", "aten.view.default", (v, [N, G, 1]), per_group)
                if w is not None:
                    wg = op(f"{name}_w", "aten.view.default", (w, [1, G, K]), TensorMeta.dense((1, G, K), "float32"))
                    v = op(f"{name}_gk", "aten.mul.Tensor", (v, wg), per_channel)
                else:  # (times 1: a pointwise op writing the broadcast value, in the scale's kernel)
                    v = op(f"{name}_gk", "aten.mul.Tensor",
                           (op(f"{name}_x", "aten.expand.default", (v, [N, G, K]), TensorMeta((N, G, K), (G, 1, 0), "float32")),
                            1.0), per_channel)
                return op(f"{name}_nc", "aten.view.default", (v, nc), nc_meta)

            w, b = n.args[1], n.args[2]
            apply(channels(mean, f"{n.name}_mean"), channels(rstd, f"{n.name}_scale", w), None, b, [C] + [1] * len(spatial))
            for k, v in {1: shifted(mean, row) if 1 in items else None, 2: rstd}.items():
                if k in items:
                    op(items[k].name, "aten.view.default", (v, [N, G]), TensorMeta.dense((N, G), "float32"))
            what = "group norm"
        notes.append(f"{n.name}: {what} of {n.args[0].name} as its statistics and a pointwise apply "
                     f"(its result feeds a {'pool' if feeds_pool(graph, m.items[0].name) else 'convolution'})"
                     f"{f'; the statistics read {m.source}' if m.shifts else ''}"
                     f"{f'; {m.source} = {m.recompute[0]} + {m.recompute[1]} recomputed by each' if m.recompute else ''}")

    gone = {u.name for m in found.values() for u in m.items.values()}
    for name, m in found.items():  # (the adds peeled: the norm and the next add were their only readers)
        x = graph.node(name).args[0].name
        for _ in range(len(m.shifts) + (m.recompute is not None)):
            gone.add(x)
            x = graph.node(x).args[0].name
    nodes = rebuilt(graph.nodes, gone, found, lower)
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
