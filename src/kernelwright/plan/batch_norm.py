"""A training-mode batch norm whose result only goes on, through elementwise ops, into a pool, as
its statistics and a pointwise apply.

As one normalization group, the batch norm writes its full-size result and the pool reads it back.
Split into the per-channel mean and biased variance over (N, spatial) and y = (x - mean) * rsqrt(var
+ eps) * weight + bias, the apply is pointwise: it joins the elementwise ops after it, which the pool
chain (plan.PoolChain) then computes as the pool's prologue, so the normalized tensor is never
written (a ResNet stem in training mode, KernelBench's convolution + batch norm + pool problems).
The running statistics and the saved mean and inverse deviation keep their names and are computed
as ATen computes them (the running variance from the unbiased variance), so buffer updates and
every reader are unchanged. Exact in real arithmetic; float32 inputs only.

The batch norm's input must come from a kernel of its own (a convolution), so that the statistics
and the apply both read it: an elementwise op before it would otherwise be written out for the
apply to read. A convolution's split-off bias (x = t + b[c], the batch norm's only reader of it)
is the one exception: the batch statistics of t + b are those of t with the mean moved by b, and
the normalized values are those of t, so both read t and the bias only enters the saved and
running means.
"""
from __future__ import annotations

import math

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, rebuilt
from kernelwright.ops import POINTWISE
from kernelwright.plan.fusion import feeds_pool

_BN = "aten._native_batch_norm_legit_functional.default"


def _bias_add(graph: Graph, x: str, n: OpNode) -> tuple[str, str] | None:
    """(t, b) when `x` = t + b with b a [C, 1, ...] value, t not elementwise, and `n` its only reader."""
    if graph.is_input(x) or [u.name for u in graph.users(x)] != [n.name] or x in graph.outputs:
        return None
    add = graph.node(x)
    if add.target != "aten.add.Tensor" or len(add.args) != 2 or not all(isinstance(a, Ref) for a in add.args):
        return None
    t, b = add.args[0].name, add.args[1].name
    xm, bm = graph.meta(x), graph.meta(b)
    if bm is None or tuple(bm.shape) != (xm.shape[1],) + (1,) * (len(xm.shape) - 2) or _elementwise(graph, t):
        return None
    return t, b


def _elementwise(graph: Graph, v: str) -> bool:
    return not graph.is_input(v) and graph.node(v).target in POINTWISE


def _match(graph: Graph, n: OpNode):
    """({output index: its getitem}, the value the statistics read, a per-channel bias or None) of a
    training batch norm over a float32 [N, C, spatial...] input that comes from a kernel of its own
    (or is such a value plus a split-off bias) and whose result feeds a pool
    (plan.fusion.feeds_pool), read only through getitems; else None."""
    if n.target != _BN or len(n.args) < 8 or n.args[5] is not True or not isinstance(n.args[0], Ref):
        return None
    x = graph.meta(n.args[0].name)
    if x is None or x.dtype != "float32" or len(x.shape) < 3 or any(not isinstance(a, (Ref, type(None)))
                                                                    for a in n.args[1:3]) \
            or not (isinstance(n.args[3], Ref) and isinstance(n.args[4], Ref)):
        return None
    items = {}
    for u in graph.users(n.name):
        if u.target != "getitem" or u.name in graph.outputs:
            return None
        items[u.args[1]] = u
    if 0 not in items or not feeds_pool(graph, items[0].name) or n.name in graph.mutations:
        return None
    x_name = n.args[0].name
    biased = _bias_add(graph, x_name, n)
    if biased is not None:
        return items, biased[0], biased[1]
    return None if _elementwise(graph, x_name) else (items, x_name, None)


def split_batch_norm_before_pools(graph: Graph) -> tuple[Graph, list[str]]:
    """Each training batch norm that feeds a pool (`_match`) as its statistics and a pointwise
    apply (module docstring)."""
    found = {n.name: m for n in graph.nodes if (m := _match(graph, n)) is not None}
    if not found:
        return graph, []
    notes: list[str] = []

    def lower(n: OpNode, match, nodes: list[OpNode]) -> None:
        items, source, shift = match
        _, w, b, rm, rv = n.args[:5]
        x = Ref(source)
        momentum, eps = float(n.args[6]), float(n.args[7])
        xm = graph.meta(source)
        C, dims = xm.shape[1], [0] + list(range(2, len(xm.shape)))
        count = math.prod(xm.shape) // C
        row = TensorMeta.dense((1, C) + (1,) * (len(xm.shape) - 2), "float32")
        vec = TensorMeta.dense((C,), "float32")
        full = items[0].meta

        def op(name, target, args, meta, kwargs=None):
            nodes.append(OpNode(name, target, tuple(args), kwargs or {}, [meta]))
            return Ref(name)

        def per_channel(v, suffix):  # a [C] parameter broadcast over the input: [C, 1, ...]
            return op(f"{n.name}_{suffix}", "aten.view.default", (v, [C] + [1] * (len(xm.shape) - 2)),
                      TensorMeta.dense((C,) + (1,) * (len(xm.shape) - 2), "float32"))

        mean = op(f"{n.name}_mean", "aten.mean.dim", (x, dims, True), row)
        batch_mean = mean if shift is None else \
            op(f"{n.name}_mean_shifted", "aten.add.Tensor", (mean, Ref(shift)), row)  # the mean of t + b
        var = op(f"{n.name}_var", "aten.var.correction", (x, dims), row, {"correction": 0, "keepdim": True})
        rstd = op(f"{n.name}_rstd", "aten.rsqrt.default",
                  [op(f"{n.name}_var_eps", "aten.add.Tensor", (var, eps), row)], row)
        y = op(f"{n.name}_centred", "aten.sub.Tensor", (x, mean), full)
        y = op(f"{n.name}_normed" if (w or b) else items[0].name, "aten.mul.Tensor", (y, rstd), full)
        if w is not None:
            y = op(f"{n.name}_scaled" if b else items[0].name, "aten.mul.Tensor", (y, per_channel(w, "weight")), full)
        if b is not None:
            op(items[0].name, "aten.add.Tensor", (y, per_channel(b, "bias")), full)
        flat = {1: (batch_mean, vec), 2: (rstd, vec)}
        for k, (v, meta) in flat.items():
            if k in items:
                op(items[k].name, "aten.view.default", (v, [C]), meta)
        for k, (stat, running, scale) in {3: (batch_mean, rm, 1.0), 4: (var, rv, count / max(count - 1, 1))}.items():
            if k in items:
                batch = op(f"{items[k].name}_batch", "aten.view.default", (stat, [C]), vec)
                new = op(f"{items[k].name}_new", "aten.mul.Tensor", (batch, momentum * scale), vec)
                # momentum * batch statistic + (1 - momentum) * running, in the statistics' kernel
                op(items[k].name, "aten.add.Tensor", (new, running), vec, {"alpha": 1.0 - momentum})
        notes.append(f"{n.name}: training batch norm of {n.args[0].name} as its statistics and a pointwise apply "
                     f"(its result feeds a pool){'' if shift is None else f'; the statistics read {source}'}")

    gone = {u.name for items, _, _ in found.values() for u in items.values()}
    gone |= {n.args[0].name for name, (_, _, shift) in found.items() if shift is not None
             for n in [graph.node(name)]}  # (the bias add: the batch norm was its only reader)
    nodes = rebuilt(graph.nodes, gone, found, lower)
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
