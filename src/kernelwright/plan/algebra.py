"""Exact algebra before fusion: a small, explicit rule set applied to a fixed point.

Each rule is one function `rule(graph, node) -> _Hit | None` whose docstring states its
precondition (when it applies) and a proof sketch (why the result is the same), with what happens
to NaN and infinities. `algebra(graph)` applies the first rule that fires anywhere (in `RULES`
order, nodes in graph order), keeps the rewrite only if it lowers the graph's FLOPs (or keeps them
and lowers its minimum bytes: analyze.cost), and starts again until no rule fires. Every applied
rewrite is one line naming the node, what it became and the FLOPs it removed.

The rules:

- size-1 dims (`size_one_*`): a reduction, softmax, log-softmax, logsumexp or vector norm over
  dims of size 1 replaced by its closed form;
- `reduction_through_affine`: a sum or mean over dims D of `y op c` with `c` constant over D
  taken over `y` first (`op` one of *, /, +, -);
- `reduction_through_eval_batch_norm`: a mean over dims other than the channels of an eval-mode
  batch norm's output taken over its input first (the norm then maps the mean);
- `reduction_through_group_norm`: a mean over the spatial dims (and the channels) of a group
  norm's output from its input's channel means and the group statistics;
- `linear_reduction`: a sum or mean over the output features of a matrix product (mm, addmm,
  bmm; possibly after per-column scales and bias adds) as a matrix-vector product with the
  weights reduced over their output dim;
- `conv_spatial_reduction`: a sum or mean over every spatial dim of a convolution or transposed
  convolution computed from box sums of its input (the convolution disappears).

Rewritten values that depend on the parameters alone (reduced weights, sliced or permuted
weights) are ordinary nodes of the graph: the emitted forward computes them from the live
parameters on every call (plan.weights), so weight edits are seen. New nodes get the meta ATen
gives them (each op is run on meta tensors), and a rewritten value keeps the meta (shape, strides,
dtype) and the name of the node it replaces; a value the model returns never becomes a view of
an input or of another returned value.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from kernelwright.analyze.classify import is_view
from kernelwright.analyze.cost import graph_cost
from kernelwright.capture.execute import resolve, substitute
from kernelwright.capture.export import tensor_meta
from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, iter_refs, reading, unique_name
from kernelwright.capture.shapes import contiguous_strides
from kernelwright.plan.dead_code import drop_unread

FLOATS = ("float32", "float64", "float16", "bfloat16")
NARROW = ("float16", "bfloat16")  # products computed wider where a rewrite changes their rounding
MAX_REWRITES = 200  # a bound on the fixed-point loop (every applied rewrite lowers the FLOPs anyway)


class _Skip(Exception):
    """A rule does not apply after all (raised while building its replacement)."""


@dataclass
class _Hit:
    """A rule's replacement for one node: new nodes (in order), the value that replaces the node
    (a new node's name or an existing value with the node's meta) and a line saying what it did."""

    nodes: list[OpNode]
    value: str
    what: str


# ---------------------------------------------------------------- building replacement nodes

def _fake(m: TensorMeta) -> torch.Tensor:
    return torch.empty_strided(m.shape, m.stride, dtype=getattr(torch, m.dtype), device="meta")


class _Build:
    """New nodes for one rewrite. Each call `b(base, target, *args, **kwargs)` appends a node named
    after `base` and returns a Ref to it; its meta is what ATen returns for those arguments (the op
    runs on meta tensors), so strides follow ATen's layout rules. A call ATen rejects raises _Skip."""

    def __init__(self, graph: Graph, taken: set[str]):
        self.graph, self.taken = graph, set(taken)
        self.nodes: list[OpNode] = []
        self.metas: dict[str, TensorMeta] = {}

    def meta(self, ref: Ref) -> TensorMeta:
        m = self.metas.get(ref.name)
        if m is None:
            m = self.graph.meta(ref.name)
        if m is None:
            raise _Skip(f"{ref.name} has no tensor meta")
        return m

    def __call__(self, base: str, target: str, *args, **kwargs) -> Ref:
        env = {r.name: _fake(self.meta(r)) for r in iter_refs((args, kwargs))}
        try:
            out = resolve(target)(*substitute(args, env, None), **substitute(kwargs, env, None))
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            raise _Skip(f"{target} rejects these arguments: {e}") from e
        meta = tensor_meta(out)
        if meta is None:
            raise _Skip(f"{target} returned no tensor")
        name = unique_name(self.taken, base)
        self.nodes.append(OpNode(name, target, tuple(args), dict(kwargs), [meta]))
        self.metas[name] = meta
        return Ref(name)


def _same_layout(a: TensorMeta, b: TensorMeta) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and all(
        s == 1 or x == y for s, x, y in zip(a.shape, a.stride, b.stride))


def _finish(b: _Build, v: Ref, want: TensorMeta, base: str) -> Ref:
    """`v` (the same elements as the node being replaced, in a shape that differs at most by
    size-1 dims or by a reshape) as a value with exactly `want`'s meta: viewed, and copied where the
    view's strides are not `want`'s (a contiguous `want` only)."""
    m = b.meta(v)
    if m.dtype != want.dtype or m.numel != want.numel:
        raise _Skip("the replacement has another dtype or size")
    if m.shape != want.shape:
        try:
            v = b(f"{base}_view", "aten.view.default", v, list(want.shape))
        except _Skip:
            v = b(f"{base}_view", "aten.view.default",
                  b(f"{base}_contiguous", "aten.clone.default", v, memory_format=torch.contiguous_format),
                  list(want.shape))
        m = b.meta(v)
    if not _same_layout(m, want):
        if not want.contiguous:
            raise _Skip("the replaced value has a layout a copy cannot give")
        v = b(f"{base}_contiguous", "aten.clone.default", v, memory_format=torch.contiguous_format)
    return v


# ---------------------------------------------------------------- reading the graph

def _meta(graph: Graph, ref: Ref) -> TensorMeta:
    """The tensor meta of `ref`'s value; a value without one (not a tensor) makes the rule not apply."""
    m = graph.meta(ref.name)
    if m is None:
        raise _Skip(f"{ref.name} is not a tensor")
    return m


def _out(n: OpNode) -> TensorMeta:
    if n.meta is None or len(n.outs) != 1:
        raise _Skip(f"{n.name} does not compute one tensor")
    return n.meta


def _kept(graph: Graph) -> set[str]:
    return set(graph.outputs) | set(graph.mutations)


def _only_reader(graph: Graph, name: str, reader: str) -> bool:
    """Whether `reader` is the only node reading `name`, which the model neither returns nor writes."""
    if name in _kept(graph):
        return False
    return [u.name for u in graph.users(name)] == [reader]


def _norm_dims(dims, rank: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({int(d) % rank for d in dims})) if rank else ()


def _arg(n: OpNode, i: int, name: str, default=None):
    if i < len(n.args):
        return n.args[i]
    return n.kwargs.get(name, default)


_SUM_MEAN = {"aten.sum.dim_IntList": "sum", "aten.sum.default": "sum", "aten.mean.dim": "mean",
             "aten.mean.default": "mean"}


def _sum_mean(graph: Graph, n: OpNode):
    """(kind "sum" | "mean", input Ref, reduced dims, keepdim) of a float sum or mean, else None."""
    kind = _SUM_MEAN.get(n.target)
    if kind is None or n.kwargs.get("dtype") is not None or not n.args or not isinstance(n.args[0], Ref):
        return None
    m = graph.meta(n.args[0].name)
    if m is None or n.meta is None or m.dtype not in FLOATS or n.meta.dtype != m.dtype or len(n.outs) != 1:
        return None
    rank = len(m.shape)
    if n.target.endswith(".default"):
        return kind, n.args[0], tuple(range(rank)), False
    return kind, n.args[0], _norm_dims(_arg(n, 1, "dim"), rank), bool(_arg(n, 2, "keepdim", False))


def _reduce(b: _Build, kind: str, x: Ref, dims, keep: bool, base: str, **kwargs) -> Ref:
    target = "aten.sum.dim_IntList" if kind == "sum" else "aten.mean.dim"
    return b(base, target, x, list(dims), keep, **kwargs)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _affine(graph: Graph, e: OpNode, y: str):
    """(op, c) when elementwise node `e` computes `y op c` from its operand `y` (of e's shape and
    dtype): op "mul", "div", "add", "sub", "rsub" (c - y) or "neg" (c None); c a finite number
    (nonzero for "div") or a Ref to a tensor of e's dtype. None otherwise."""
    m, ym = e.meta, graph.meta(y)
    if m is None or ym is None or len(e.outs) != 1 or ym.shape != m.shape or ym.dtype != m.dtype \
            or m.dtype not in FLOATS:
        return None
    t, a = e.target, e.args
    if t == "aten.neg.default":
        return ("neg", None) if a == (Ref(y),) and not e.kwargs else None
    if len(a) != 2 or e.kwargs.get("alpha", 1) != 1 or set(e.kwargs) - {"alpha"}:
        return None
    first = isinstance(a[0], Ref) and a[0].name == y
    other = a[1] if first else a[0]
    if not first and not (isinstance(a[1], Ref) and a[1].name == y):
        return None
    if isinstance(other, Ref):
        om = graph.meta(other.name)
        if om is None or om.dtype != m.dtype or other.name == y:
            return None
    elif not _number(other):
        return None
    op = {"aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
          "aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub",
          "aten.rsub.Scalar": "rsub"}.get(t)
    if op is None:
        return None
    if not first:  # c op y
        if op in ("mul", "add"):
            return op, other
        if op == "sub":
            return "rsub", other
        return None
    if op == "div" and not isinstance(other, Ref) and other == 0:
        return None
    return op, other


def _aligned(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` right-aligned to `rank` dims (leading 1s)."""
    return (1,) * (rank - len(shape)) + tuple(shape)


# ---------------------------------------------------------------- rules: size-1 dims

_SIZE_ONE_REDUCTIONS = {"aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default",
                        "aten.amax.default", "aten.amin.default", "aten.prod.dim_int", "aten.prod.default"}


def _reduced_dims(n: OpNode, rank: int) -> tuple[int, ...] | None:
    t = n.target
    if t.endswith(".default") and t.split(".")[1] in ("sum", "mean", "prod"):
        return tuple(range(rank))
    if t == "aten.prod.dim_int":
        d = _arg(n, 1, "dim")
        return None if d is None else _norm_dims(d, rank)
    return _norm_dims(_arg(n, 1, "dim"), rank)


def size_one_reduction(graph: Graph, n: OpNode) -> _Hit | None:
    """sum / mean / amax / amin / prod over dims that all have size 1 -> the element itself (a view).

    Precondition: every reduced dim of the input has size 1, no `dtype` argument, and the result has
    the input's dtype (so a sum of integers, which torch widens, is left alone).
    Proof: a reduction over one element returns it: sum = 0 + x, mean = x / 1, prod = 1 * x,
    amax = amin = x. NaN and infinities come back as they are, as from torch. One difference in
    sign only: torch's sum and mean of a -0.0 give +0.0 and the view gives -0.0; the two compare
    equal, as `plan.rewrites.simplify` treats `x + 0` as `x`."""
    if n.target not in _SIZE_ONE_REDUCTIONS or not n.args or not isinstance(n.args[0], Ref) or n.meta is None \
            or len(n.outs) != 1 or n.kwargs.get("dtype") is not None:
        return None
    m = graph.meta(n.args[0].name)
    if m is None or m.dtype != n.meta.dtype:
        return None
    dims = _reduced_dims(n, len(m.shape))
    if dims is None or any(m.shape[d] != 1 for d in dims):
        return None
    b = _Build(graph, _names(graph))
    v = _finish(b, n.args[0], n.meta, n.name)
    return _Hit(b.nodes, v.name, f"{n.op} over size-1 dims {list(dims)} of {n.args[0].name} is the element itself")


def size_one_max(graph: Graph, n: OpNode) -> _Hit | None:
    """The values of max.dim / min.dim over a dim of size 1 -> the element itself (a view).

    Precondition: `n` is getitem 0 of an `aten.max.dim` / `aten.min.dim` whose dim has size 1 (the
    indices, getitem 1, are left as they are: the op stays while they are read).
    Proof: the max and min of one element are that element, NaN and infinities included."""
    if n.target != "getitem" or len(n.args) != 2 or n.args[1] != 0 or n.meta is None:
        return None
    src = graph.producer(n.args[0])
    if src is None or src.target not in ("aten.max.dim", "aten.min.dim") or not isinstance(src.args[0], Ref):
        return None
    m = graph.meta(src.args[0].name)
    if m is None or not m.shape or m.shape[int(src.args[1]) % len(m.shape)] != 1:
        return None
    b = _Build(graph, _names(graph))
    v = _finish(b, src.args[0], n.meta, n.name)
    return _Hit(b.nodes, v.name, f"{src.op} over a size-1 dim of {src.args[0].name} is the element itself")


def size_one_softmax(graph: Graph, n: OpNode) -> _Hit | None:
    """softmax over a dim of size 1 -> (x - x) + 1; log_softmax -> x - x.

    Precondition: `aten._softmax` / `aten._log_softmax` (no half-to-float) over a dim of size 1.
    Proof: with one element, softmax = exp(x - x) / exp(x - x) = 1 and log_softmax = (x - x) -
    log(1) = +0 for finite x. For x = +-inf or NaN torch gives NaN (x - max(x) is inf - inf); so
    does x - x, and NaN + 1 is NaN. A finite x gives exactly 1 (+0 + 1) and +0 (x - x is +0 under
    round-to-nearest), torch's values. The closed form is a pointwise op on x, which fuses with
    whatever reads it."""
    if n.target not in ("aten._softmax.default", "aten._log_softmax.default") or len(n.args) != 3 \
            or not isinstance(n.args[0], Ref) or n.args[2] or n.meta is None:
        return None
    m = graph.meta(n.args[0].name)
    if m is None or m.dtype != n.meta.dtype or m.dtype not in FLOATS or not m.shape \
            or m.shape[int(n.args[1]) % len(m.shape)] != 1:
        return None
    b = _Build(graph, _names(graph))
    x = n.args[0]
    v = b(f"{n.name}_zero", "aten.sub.Tensor", x, x)
    if n.target == "aten._softmax.default":
        v = b(f"{n.name}_one", "aten.add.Tensor", v, 1.0)
    v = _finish(b, v, n.meta, n.name)
    form = "(x - x) + 1" if n.target == "aten._softmax.default" else "x - x"
    return _Hit(b.nodes, v.name, f"{n.op} over a size-1 dim of {x.name} is {form} (1 or 0; NaN where x is not finite)")


def _is_inf_test(graph: Graph, ref, amax: Ref) -> bool:
    """Whether `ref` is `abs(amax) == inf`."""
    eq = graph.producer(ref)
    if eq is None or eq.target != "aten.eq.Scalar" or eq.args[1] != math.inf:
        return False
    ab = graph.producer(eq.args[0])
    return ab is not None and ab.target == "aten.abs.default" and ab.args[0] == amax


def _zero(graph: Graph, v) -> bool:
    if _number(v):
        return v == 0
    z = graph.producer(v)
    return z is not None and z.target == "aten.scalar_tensor.default" and bool(z.args) and z.args[0] == 0


def _lse_shift(graph: Graph, ref, x: Ref):
    """(amax node) when `ref` is torch's logsumexp shift where(abs(m) == inf, 0, m), m = amax(x, dims, True)."""
    w = graph.producer(ref)
    if w is None:
        return None
    if w.target == "aten.where.self" and _zero(graph, w.args[1]):
        amax = w.args[2]
    elif w.target == "aten.where.ScalarSelf" and _zero(graph, w.args[1]):
        amax = w.args[2]
    else:
        return None
    a = graph.producer(amax)
    if a is None or a.target != "aten.amax.default" or a.args[0] != x or not _arg(a, 2, "keepdim", False) \
            or not _is_inf_test(graph, w.args[0], amax):
        return None
    return a


def size_one_logsumexp(graph: Graph, n: OpNode) -> _Hit | None:
    """logsumexp over dims that all have size 1 -> the element itself (a view).

    Precondition: `aten.logsumexp` over size-1 dims, or torch's decomposition of it ending at `n`:
    log(sum(exp(x - s), dims)) + s (s squeezed when not keepdim), s = where(|m| == inf, 0, m),
    m = amax(x, dims, keepdim=True), every dim in `dims` of size 1 in x.
    Proof: for one finite element, m = x, x - m = 0, exp = 1, sum = 1, log = 0, 0 + x = x exactly.
    For x = +inf: s = 0, exp(inf) = inf, log = inf, inf + 0 = inf; for -inf: exp = 0, log = -inf,
    -inf + 0 = -inf; NaN stays NaN. So the result is x for every input."""
    if n.meta is None or len(n.outs) != 1:
        return None
    if n.target == "aten.logsumexp.default" and isinstance(n.args[0], Ref):
        x = n.args[0]
        m = graph.meta(x.name)
        dims = _norm_dims(_arg(n, 1, "dim"), len(m.shape)) if m is not None else None
    elif n.target == "aten.add.Tensor" and len(n.args) == 2 and not n.kwargs:
        log = graph.producer(n.args[0])
        s = graph.producer(log.args[0]) if log is not None and log.target == "aten.log.default" else None
        red = _sum_mean(graph, s) if s is not None else None
        if red is None or red[0] != "sum":
            return None
        ex = graph.producer(red[1])
        sub = graph.producer(ex.args[0]) if ex is not None and ex.target == "aten.exp.default" else None
        if sub is None or sub.target != "aten.sub.Tensor" or sub.kwargs or not isinstance(sub.args[0], Ref):
            return None
        x = sub.args[0]
        amax = _lse_shift(graph, sub.args[1], x)
        if amax is None:
            return None
        m = _meta(graph, x)
        dims = red[2]
        shift = n.args[1]
        sq = graph.producer(shift)
        if shift != sub.args[1] and not (sq is not None and sq.target in ("aten.squeeze.dims", "aten.squeeze.dim",
                                                                        "aten.view.default")
                                         and sq.args[0] == sub.args[1]):
            return None
        if _norm_dims(_arg(amax, 1, "dim"), len(m.shape)) != dims:
            return None
    else:
        return None
    if m is None or m.dtype != n.meta.dtype or m.dtype not in FLOATS or dims is None \
            or any(m.shape[d] != 1 for d in dims):
        return None
    b = _Build(graph, _names(graph))
    v = _finish(b, x, n.meta, n.name)
    return _Hit(b.nodes, v.name, f"logsumexp over size-1 dims {list(dims)} of {x.name} is the element itself")


def size_one_norm(graph: Graph, n: OpNode) -> _Hit | None:
    """A vector norm (ord 1, 2, inf or -inf) over dims that all have size 1 -> abs(x).

    Precondition: `aten.linalg_vector_norm` of a float tensor, no `dtype` argument, every reduced
    dim of size 1.
    Proof: the 1-, 2-, inf- and -inf-norms of one element are all |x|; NaN gives NaN and +-inf
    gives inf, as torch's kernel does. |x| is the exact value at every magnitude (torch's CPU
    kernel also returns 1e30 for 1e30 and 1e-30 for 1e-30, where squaring in float32 would over-
    or underflow: tests/unit/test_algebra.py)."""
    if n.target != "aten.linalg_vector_norm.default" or not isinstance(n.args[0], Ref) or n.meta is None \
            or _arg(n, 4, "dtype") is not None:
        return None
    order = _arg(n, 1, "ord", 2)
    if not isinstance(order, (int, float)) or float(order) not in (1.0, 2.0, math.inf, -math.inf):
        return None
    m = graph.meta(n.args[0].name)
    if m is None or m.dtype != n.meta.dtype or m.dtype not in FLOATS:
        return None
    dims = _norm_dims(_arg(n, 2, "dim"), len(m.shape))
    if any(m.shape[d] != 1 for d in dims):
        return None
    b = _Build(graph, _names(graph))
    v = _finish(b, b(f"{n.name}_abs", "aten.abs.default", n.args[0]), n.meta, n.name)
    return _Hit(b.nodes, v.name, f"vector norm (ord {order}) over size-1 dims {list(dims)} of {n.args[0].name} "
                                 "is abs of the element")


# ---------------------------------------------------------------- rule: reductions through affine ops

def reduction_through_affine(graph: Graph, n: OpNode) -> _Hit | None:
    """sum / mean over dims D of (y op c) -> (sum / mean of y over D) op c', for c constant over D.

    Precondition: `n` is a float sum or mean over D of the value of an elementwise node read only by
    `n` that computes y * c, y / c, y + c, y - c, c - y or -y, where c is a finite number (nonzero
    as a divisor) or a tensor of y's dtype with size 1 in every dim of D (as broadcast to y).
    Proof: c does not vary over the reduced elements, so with P = the number of elements reduced,
    sum(y * c) = c * sum(y), sum(y / c) = sum(y) / c, sum(y + c) = sum(y) + P * c,
    sum(c - y) = P * c - sum(y), sum(-y) = -sum(y); a mean is the sum divided by P, so c (not P * c)
    is added there. Exact in real arithmetic; in floating point the rounding of a reassociated sum.
    NaN in y or c propagates either way. One difference with infinities: a tensor multiplier c
    holding +-inf (or a tensor divisor holding 0) times elements of y of both signs or zero gives
    NaN in the original and +-inf here (or the reverse); for finite multipliers and nonzero
    divisors infinities in y give the same result both ways (a finite factor keeps or flips every
    sign alike)."""
    red = _sum_mean(graph, n)
    if red is None or n.name in graph.mutations:
        return None
    kind, v, dims, keep = red
    e = graph.producer(v)
    if e is None or not _only_reader(graph, v.name, n.name):
        return None
    vm, want = _meta(graph, v), _out(n)
    rank = len(vm.shape)
    for y in dict.fromkeys(r.name for r in e.args if isinstance(r, Ref)):
        form = _affine(graph, e, y)
        if form is None:
            continue
        op, c = form
        if isinstance(c, Ref):
            full = _aligned(_meta(graph, c).shape, rank)
            if any(full[d] != 1 for d in dims):
                continue
        count = math.prod(vm.shape[d] for d in dims)
        b = _Build(graph, _names(graph))
        z = _reduce(b, kind, Ref(y), dims, keep, f"{n.name}_inner")
        if op == "neg":
            z = b(f"{n.name}_neg", "aten.neg.default", z)
        else:
            if isinstance(c, Ref) and not keep:
                shape = [s for d, s in enumerate(_aligned(_meta(graph, c).shape, rank)) if d not in dims]
                c = b(f"{c.name}_reduced", "aten.view.default", c, shape) if shape != list(_meta(graph, c).shape) \
                    else c
            if op in ("add", "sub", "rsub") and kind == "sum" and count != 1:
                c = b(f"{n.name}_times", "aten.mul.Tensor", c, count) if isinstance(c, Ref) else c * count
            if op == "rsub":
                z = b(f"{n.name}_rsub", "aten.sub.Tensor", c, z) if isinstance(c, Ref) \
                    else b(f"{n.name}_rsub", "aten.rsub.Scalar", z, c)
            else:
                z = b(f"{n.name}_{op}", f"aten.{op}.Tensor", z, c)
        z = _finish(b, z, want, n.name)
        what = {"neg": "-", "mul": "*", "div": "/", "add": "+", "sub": "-", "rsub": "-"}[op]
        return _Hit(b.nodes, z.name, f"{n.op} over {list(dims)} taken before the {what} of {e.name} "
                                     "(its other operand is constant over the reduced dims)")
    return None


def _mean_of_norm(graph: Graph, n: OpNode, target: str):
    """(the norm node, reduced dims, keepdim) when `n` is a float mean of output 0 of a `target`
    node (a normalization), read only by `n`, whose other outputs (its statistics) nothing reads;
    else None."""
    red = _sum_mean(graph, n)
    if red is None or red[0] != "mean" or n.name in graph.mutations:
        return None
    _, v, dims, keep = red
    item = graph.producer(v)
    if item is None or item.target != "getitem" or item.args[1] != 0 or not _only_reader(graph, v.name, n.name):
        return None
    norm = graph.producer(item.args[0])
    if norm is None or norm.target != target:
        return None
    if any(u.name != item.name for u in graph.users(norm.name)) or norm.name in _kept(graph):
        return None  # its statistics are read elsewhere
    return norm, dims, keep


_EVAL_BN = "aten._native_batch_norm_legit_no_training.default"


def reduction_through_eval_batch_norm(graph: Graph, n: OpNode) -> _Hit | None:
    """mean over dims D of an inference-mode batch norm's output -> the batch norm's affine map of
    the mean over D of its input, for D without the channel dim (dim 1).

    Precondition: `n` is a float mean over D, 1 not in D, of output 0 of
    `_native_batch_norm_legit_no_training(y, w, b, running_mean, running_var, momentum, eps)` (the
    op of a BatchNorm module in eval mode), whose statistics outputs nothing reads and whose output
    only `n` reads.
    Proof: in eval mode the op computes, per channel c, (y - m_c) * r_c * w_c + b_c with
    r_c = 1 / sqrt(v_c + eps), an affine map y * a_c + t_c whose factors do not vary over D, so
    mean_D(y * a_c + t_c) = mean_D(y) * a_c + t_c: the same map applied to mean_D(y). Exact in real
    arithmetic; in floating point the rounding of a reassociated sum. NaN in y, the statistics or
    the affine weights propagates either way. Infinities: an infinite element of y gives +-inf in
    the original's mean and here alike (a finite factor keeps or flips every sign alike); a zero
    factor a_c (w_c = 0) times an infinite y gives NaN in the original's element and NaN here."""
    found = _mean_of_norm(graph, n, _EVAL_BN)
    if found is None or len(found[0].args) < 7:
        return None
    bn, dims, keep = found
    y, w, bias, mean, var, eps = bn.args[0], bn.args[1], bn.args[2], bn.args[3], bn.args[4], bn.args[6]
    ym, want = _meta(graph, y), _out(n)
    rank = len(ym.shape)
    if rank < 2 or 1 in dims or not _number(eps) or not all(isinstance(a, Ref) for a in (y, mean, var)) \
            or ym.dtype in NARROW:  # (the op normalizes in float32; a bf16 mean of bf16 y would round first)
        return None
    channel = 1 if keep or 0 not in dims else 0  # the channel dim's place in the reduced tensor
    b = _Build(graph, _names(graph))
    z = _reduce(b, "mean", y, dims, keep, f"{n.name}_inner")
    trailing = len(b.meta(z).shape) - channel - 1

    def per_channel(ref: Ref, base: str) -> Ref:
        shape = [ym.shape[1]] + [1] * trailing
        return ref if list(b.meta(ref).shape) == shape else b(base, "aten.view.default", ref, shape)

    r = b(f"{n.name}_rstd", "aten.rsqrt.default", b(f"{n.name}_var_eps", "aten.add.Tensor", var, eps))
    z = b(f"{n.name}_centred", "aten.sub.Tensor", z, per_channel(mean, f"{mean.name}_bn_view"))
    z = b(f"{n.name}_scaled", "aten.mul.Tensor", z, per_channel(r, f"{n.name}_rstd_view"))
    if isinstance(w, Ref):
        z = b(f"{n.name}_weighted", "aten.mul.Tensor", z, per_channel(w, f"{w.name}_bn_view"))
    if isinstance(bias, Ref):
        z = b(f"{n.name}_shifted", "aten.add.Tensor", z, per_channel(bias, f"{bias.name}_bn_view"))
    z = _finish(b, z, want, n.name)
    return _Hit(b.nodes, z.name, f"mean over {list(dims)} taken before the eval-mode batch norm {bn.name} "
                                 f"(a per-channel affine map; {want.numel} values normalised, not {ym.numel})")


def reduction_through_group_norm(graph: Graph, n: OpNode) -> _Hit | None:
    """mean over every spatial dim (and optionally the channels) of a group norm's output -> the
    group norm's map of its input's per-channel means, from the group statistics, without the
    normalized tensor.

    Precondition: `n` is a float mean over D, with S = every dim past the channels (at least one)
    in D and D within S and the channel dim 1, of output 0 of `native_group_norm(y, w, b, N, C,
    HxW, G, eps)` read only by `n`, whose statistics outputs nothing reads, y contiguous.
    Proof: the op computes out[n, c, s] = (y[n, c, s] - mu[n, g]) * r[n, g] * w[c] + b[c] for the
    group g of channel c, with mu and var the mean and (biased) variance of y over the group's
    channels and positions and r = 1 / sqrt(var + eps). Over s everything but y is constant, so
    mean_S(out)[n, c] = (mean_S(y)[n, c] - mu[n, g]) * r[n, g] * w[c] + b[c]; and, the groups
    holding C / G channels of S positions each, mu[n, g] is the mean over the group's channels of
    mean_S(y)[n, c]; var[n, g] is the mean over the group's channels of each channel's variance
    over s plus the variance of the channel means about mu (the law of total variance, every
    channel holding S positions), so one pass over y yields each channel's mean and variance (a
    Welford reduction) and the rest is per channel. A mean over the channels too is taken after.
    Exact in real arithmetic; in floating point the rounding of reassociated sums, the variances
    combined without cancellation as in Chan's parallel formula. NaN anywhere in a group's y makes
    its mu or var NaN and so the group's results NaN, here as in the original; an infinity in y
    makes a variance NaN (inf - inf), the same."""
    found = _mean_of_norm(graph, n, "aten.native_group_norm.default")
    if found is None or len(found[0].args) != 8:
        return None
    gn, dims, keep = found
    y, w, bias, groups, eps = gn.args[0], gn.args[1], gn.args[2], gn.args[6], gn.args[7]
    ym, want = _meta(graph, y), _out(n)
    rank = len(ym.shape)
    space = tuple(range(2, rank))
    if not isinstance(y, Ref) or not space or not set(space) <= set(dims) or not set(dims) <= {1, *space} \
            or not isinstance(groups, int) or groups < 1 or not _number(eps) or not ym.contiguous \
            or ym.dtype in NARROW:  # (the op keeps its statistics in float32; bf16 ones would round)
        return None
    nb, c = ym.shape[:2]
    if c % groups:
        return None
    b = _Build(graph, _names(graph))
    # per channel of every image, over the positions: the mean and the variance (one pass over y)
    m = b(f"{n.name}_channel_means", "aten.mean.dim", y, list(space), False)  # [N, C]
    vc = b(f"{n.name}_channel_vars", "aten.var.correction", y, list(space), correction=0, keepdim=False)
    mg = b(f"{n.name}_by_group", "aten.view.default", m, [nb, groups, c // groups])
    mu = b(f"{n.name}_group_mean", "aten.mean.dim", mg, [2], True)
    # the group's variance from its channels' (all of one count): their mean plus the variance of
    # their means about the group's
    spread = b(f"{n.name}_mean_spread", "aten.sub.Tensor", mg, mu)
    between = b(f"{n.name}_between", "aten.mean.dim", b(f"{n.name}_spread_sq", "aten.mul.Tensor", spread, spread),
                [2], True)
    within = b(f"{n.name}_within", "aten.mean.dim", b(f"{n.name}_vars_by_group", "aten.view.default", vc,
                                                        [nb, groups, c // groups]), [2], True)
    var = b(f"{n.name}_group_var", "aten.add.Tensor", within, between)
    r = b(f"{n.name}_group_rstd", "aten.rsqrt.default", b(f"{n.name}_group_var_eps", "aten.add.Tensor", var, eps))
    z = b(f"{n.name}_normalized", "aten.mul.Tensor", spread, r)
    z = b(f"{n.name}_channels", "aten.view.default", z, [nb, c])
    if isinstance(w, Ref):
        z = b(f"{n.name}_weighted", "aten.mul.Tensor", z, w)
    if isinstance(bias, Ref):
        z = b(f"{n.name}_shifted", "aten.add.Tensor", z, bias)
    if 1 in dims:
        z = b(f"{n.name}_over_channels", "aten.mean.dim", z, [1], False)
    z = _finish(b, z, want, n.name)
    return _Hit(b.nodes, z.name, f"mean over {list(dims)} of the group norm {gn.name} from its input's channel "
                                 f"means and the group statistics ({ym.numel} values not normalized)")


# ---------------------------------------------------------------- rule: reductions of matrix products

_GEMM = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
_VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def _gemm_chain(graph: Graph, cur: Ref, reader: str, depth: int = 0):
    """(steps, view, product) when `cur`, read only by `reader`, is computed from a matrix product
    through elementwise affine steps (each `(node, op, c)` of `_affine`, the outermost first), each
    value read only by the next, with at most one view, right after the product; else None."""
    node = graph.producer(cur)
    if node is None or depth > 32 or not _only_reader(graph, cur.name, reader):
        return None
    if node.target in _GEMM:
        return [], None, node
    if node.target in _VIEWS:
        inner = graph.producer(node.args[0])
        if inner is not None and inner.target in _GEMM and _only_reader(graph, node.args[0].name, node.name):
            return [], node, inner
        return None
    for y in dict.fromkeys(a.name for a in node.args if isinstance(a, Ref)):
        form = _affine(graph, node, y)
        found = None if form is None else _gemm_chain(graph, Ref(y), node.name, depth + 1)
        if found is not None:
            return [(node, *form)] + found[0], found[1], found[2]
    return None


def linear_reduction(graph: Graph, n: OpNode) -> _Hit | None:
    """sum / mean over the last dim of a matrix product (after per-column scales and bias adds) ->
    a matrix-vector product with the reduced weights.

    Precondition: `n` is a float sum or mean over dims D of v, D holding v's last dim; v is
    computed from G = mm(A, B) / addmm(bias, A, B) (scalar alpha and beta) / bmm(A, B) through a
    chain of nodes each read only by the next: an optional view of G that keeps its last dim, then
    elementwise steps v op c (op *, /, +, -, c - v, -v). Multiplicative operands c are finite
    numbers or tensors constant over G's rows (dim -2 of G; with the view, every dim but the last);
    additive operands are numbers or tensors that broadcast into v (with the view: constant over
    every dim but the last). Every tensor has G's dtype.
    Proof: such a chain computes v[.., m, n] = sum_k A[m, k] * B'[k, n] + C[.., m, n], where B' is B
    with the chain's per-column factors applied (alpha, c, 1 / c, signs) and C collects the bias and
    the additive operands times the factors after them. Summing over n:
    sum_n v = A @ (sum_n B'[:, n]) + sum_n C, a matrix-vector product with weights reduced over
    their output dim (mean: both terms divided by N), computed as sum_k A[m, k] * w[k] (a multiply
    and a row sum); the remaining dims of D are reduced after.
    B' and its sum depend on B and the operands only: for a Linear, on the parameters, recomputed
    from them on every call. Exact in real arithmetic (distributivity), the rounding of a
    reassociated sum in floating point; NaN anywhere propagates. Infinities: pulling A out of the
    sum assumes A finite: an infinite A[m, k] meeting columns of B' of both signs gives NaN in the
    original and +-inf here."""
    red = _sum_mean(graph, n)
    if red is None or n.name in graph.mutations:
        return None
    kind, v, dims, keep = red
    vm, want = _meta(graph, v), _out(n)
    rank = len(vm.shape)
    if rank < 1 or rank - 1 not in dims:
        return None
    found = _gemm_chain(graph, v, n.name)
    if found is None:
        return None
    steps, view, gemm = found
    gm = gemm.meta
    if gm is None or gm.dtype != vm.dtype:
        return None
    if gemm.target == "aten.addmm.default":
        bias, a, w = gemm.args[:3]
        alpha, beta = gemm.kwargs.get("alpha", 1), gemm.kwargs.get("beta", 1)
        if set(gemm.kwargs) - {"alpha", "beta"} or not (_number(alpha) and _number(beta)):
            return None
    else:
        (a, w), bias, alpha, beta = gemm.args[:2], None, 1, 1
    if not all(isinstance(r, Ref) and _meta(graph, r).dtype == gm.dtype
               for r in [a, w] + ([bias] if bias is not None else [])):
        return None
    flat = view is not None
    if flat and (gemm.target == "aten.bmm.default" or vm.shape[-1] != gm.shape[-1] or len(gm.shape) != 2):
        return None
    n_cols = gm.shape[-1]
    b = _Build(graph, _names(graph))

    def column(c: Ref, additive: bool) -> Ref:
        """Operand c in the product's coordinates, where it must be constant over the rows."""
        cm = b.meta(c)
        if flat:
            if any(s != 1 for s in cm.shape[:-1]):
                raise _Skip("an operand varies over the rows")
            return c if len(cm.shape) == 1 else b(f"{c.name}_columns", "aten.view.default", c,
                                                  [cm.shape[-1] if cm.shape else 1])
        if not additive and len(cm.shape) >= 2 and cm.shape[-2] != 1:
            raise _Skip("a factor varies over the rows")
        return c

    try:
        wp, cp, cs = w, None, 0.0  # weights with the factors applied, additive tensor term, additive number
        if alpha != 1:
            wp = b(f"{w.name}_alpha", "aten.mul.Tensor", wp, alpha)
        if bias is not None and beta != 0:
            cp = column(bias, True)
            if beta != 1:
                cp = b(f"{bias.name}_beta", "aten.mul.Tensor", cp, beta)
        for node, op, c in reversed(steps):
            if op == "neg" or op == "rsub":
                wp = b(f"{w.name}_neg", "aten.neg.default", wp)
                cp = None if cp is None else b(f"{node.name}_neg", "aten.neg.default", cp)
                cs = -cs
                if op == "neg":
                    continue
                op = "add"  # c - v = -v + c
            if op in ("mul", "div"):
                if isinstance(c, Ref):
                    c = column(c, False)
                    if cs:
                        f = c if op == "mul" else b(f"{c.name}_recip", "aten.reciprocal.default", c)
                        term = b(f"{node.name}_const", "aten.mul.Tensor", f, cs)
                        cs = 0.0
                    else:
                        term = None
                else:
                    term = None
                    cs = cs * c if op == "mul" else cs / c
                target = f"aten.{op}.Tensor"
                wp = b(f"{w.name}_{op}", target, wp, c)
                cp = None if cp is None else b(f"{node.name}_{op}", target, cp, c)
                if term is not None:
                    cp = term if cp is None else b(f"{node.name}_add", "aten.add.Tensor", cp, term)
            else:  # add / sub
                if isinstance(c, Ref):
                    c = column(c, True)
                    if cp is None:
                        cp = c if op == "add" else b(f"{node.name}_neg", "aten.neg.default", c)
                    else:
                        cp = b(f"{node.name}_{op}", f"aten.{op}.Tensor", cp, c)
                else:
                    cs = cs + c if op == "add" else cs - c
        # the matrix-vector product as a multiply and a row sum, not a matrix product: the precision
        # policies narrow matrix products (tf32, bf16 operands), which would round the reduced
        # weights, a sum of N columns, where the original rounded each of the N products (the
        # plan fuses the two into one pass over A). A bf16 / fp16 product also sums its reduced
        # weights and the terms in float32, rounded once at the end: KernelBench level-2 14 under
        # bf16 autocast measured 4.6x eager's error against float64 with the reduced weights
        # rounded to bf16.
        wide = {"dtype": torch.float32} if gm.dtype in NARROW else {}
        rank_w = len(b.meta(wp).shape)
        wsum = _reduce(b, kind, wp, [rank_w - 1], True, f"{w.name}_reduced", **wide)
        av = b(f"{a.name}_wide", "aten._to_copy.default", a, **wide) if wide else a
        terms = b(f"{n.name}_terms", "aten.mul.Tensor", av, b(f"{w.name}_row", "aten.transpose.int", wsum, rank_w - 2, rank_w - 1))
        z = b(f"{n.name}_gemv", "aten.sum.dim_IntList", terms, [rank_w - 1], True)
        if wide:
            z = b(f"{n.name}_gemv_narrow", "aten._to_copy.default", z, dtype=getattr(torch, gm.dtype))
        if flat:
            z = b(f"{n.name}_rows", "aten.view.default", z, list(vm.shape[:-1]) + [1])
        if cp is not None:
            cm = b.meta(cp)
            if cm.shape and cm.shape[-1] != 1:
                csum = _reduce(b, kind, cp, [len(cm.shape) - 1], True, f"{n.name}_bias")
            else:
                csum = cp if kind == "mean" else b(f"{n.name}_bias", "aten.mul.Tensor", cp, n_cols)
            z = b(f"{n.name}_biased", "aten.add.Tensor", z, csum)
        if cs:
            z = b(f"{n.name}_shifted", "aten.add.Tensor", z, cs * (n_cols if kind == "sum" else 1))
        rest = [d for d in dims if d != rank - 1]
        if rest:
            z = _reduce(b, kind, z, rest, True, f"{n.name}_rest")
        if b.meta(z).shape != tuple(1 if d in dims else s for d, s in enumerate(vm.shape)):
            raise _Skip("an operand broadcasts the product to another shape")
        z = _finish(b, z, want, n.name)
    except _Skip:
        return None
    chain = "".join(f" -> {node.op}" for node, _, _ in reversed(steps))
    return _Hit(b.nodes, z.name, f"{n.op} over the output features of {gemm.name} ({gemm.op}){chain} as a "
                                 f"matrix-vector product with {w.name} reduced over its output dim; the {gemm.op} is "
                                 "removed")


# ---------------------------------------------------------------- rule: reductions of convolutions

def _cdiv(a: int, b: int) -> int:
    return -((-a) // b)


def _tap_windows(size: int, out: int, k: int, s: int, p: int, d: int, transposed: bool):
    """Per tap of one spatial dim: (start, count, step) of the input positions the tap reads over
    all `out` output positions (zero padding excluded), or None when it reads only padding.
    Convolution: output o reads input o*s + tap*d - p. Transposed: input i feeds output
    i*s + tap*d - p, counted when that lies in [0, out)."""
    windows = []
    for tap in range(k):
        off = tap * d - p
        if transposed:
            lo, hi = max(0, _cdiv(-off, s)), min(size - 1, (out - 1 - off) // s)
            windows.append((lo, hi - lo + 1, 1) if hi >= lo else None)
        else:
            lo, hi = max(0, _cdiv(-off, s)), min(out - 1, (size - 1 - off) // s)
            windows.append((lo * s + off, hi - lo + 1, s) if hi >= lo else None)
    return windows


def _window_sums(b: _Build, t: Ref, dim: int, windows, name: str) -> list[Ref]:
    """The sums of `t` over each window along `dim` (keepdim), every element read once per window
    but the elements all windows of one phase share, which are summed once (their core): a
    window's sum is its left strip + the core + its right strip."""
    size = b.meta(t).shape[dim]
    cache: dict[tuple[int, int, int], Ref] = {}

    def piece(start: int, count: int, step: int) -> Ref:
        key = (start, count, step)
        if key not in cache:
            src = t
            if not (start == 0 and step == 1 and count == size):
                src = b(f"{name}_slice", "aten.slice.Tensor", t, dim, start, start + (count - 1) * step + 1, step)
            cache[key] = src if count == 1 else b(f"{name}_sum", "aten.sum.dim_IntList", src, [dim], True)
        return cache[key]

    phases: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for w in windows:
        phases.setdefault((w[0] % w[2], w[2]), []).append(w)
    sums = []
    for start, count, step in windows:
        group = phases[(start % step, step)]
        lo = max(w[0] for w in group)
        hi = min(w[0] + (w[1] - 1) * w[2] for w in group)
        end = start + (count - 1) * step
        if len(group) == 1 or hi < lo:
            sums.append(piece(start, count, step))
            continue
        parts = []
        if start < lo:
            parts.append(piece(start, (lo - start) // step, step))
        parts.append(piece(lo, (hi - lo) // step + 1, step))
        if end > hi:
            parts.append(piece(hi + step, (end - hi) // step, step))
        total = parts[0]
        for p in parts[1:]:
            total = b(f"{name}_add", "aten.add.Tensor", total, p)
        sums.append(total)
    return sums


def _reading_taps(xm: TensorMeta, om: TensorMeta, wm: TensorMeta, dims, strides, pads, dilations, transposed: bool):
    """Per spatial dim j in `dims`: the range [lo, hi) of the taps that read input elements and
    their windows (`_tap_windows`), as two dicts keyed by j; None when some dim's reading taps are
    not one contiguous range (or none reads)."""
    live: dict[int, tuple[int, int]] = {}
    windows: dict[int, list] = {}
    for j in dims:
        ws = _tap_windows(xm.shape[2 + j], om.shape[2 + j], wm.shape[2 + j], strides[j], pads[j], dilations[j],
                          transposed)
        reading = [k for k, win in enumerate(ws) if win is not None]
        if not reading or reading != list(range(reading[0], reading[-1] + 1)):
            return None
        live[j] = (reading[0], reading[-1] + 1)
        windows[j] = [ws[k] for k in reading]
    return live, windows


def _as_reduction(b: _Build, n: OpNode, z: Ref, kind: str, positions: int, bias, bias_shape, dims, want: TensorMeta,
                  keep=None) -> Ref:
    """The contraction `z` of a convolution's window sums as the result of reduction `n`: divided by
    the `positions` summed for a mean, the convolution's bias added (viewed as `bias_shape`; times
    `positions` for a sum), viewed as `keep` (the reduced spatial dims as size 1), the batch or
    channel dims `n` also reduces reduced, shaped as `want`."""
    if kind == "mean" and positions != 1:
        z = b(f"{n.name}_mean", "aten.div.Tensor", z, positions)
    if bias is not None:
        bt = bias if list(b.meta(bias).shape) == list(bias_shape) else \
            b(f"{bias.name}_col", "aten.view.default", bias, list(bias_shape))
        if kind == "sum" and positions != 1:
            bt = b(f"{bias.name}_times", "aten.mul.Tensor", bt, positions)
        z = b(f"{n.name}_bias", "aten.add.Tensor", z, bt)
    if keep is not None:
        z = b(f"{n.name}_keep", "aten.view.default", z, list(keep))
    rest = [d for d in dims if d < 2]
    if rest:
        z = _reduce(b, kind, z, rest, True, f"{n.name}_rest")
    return _finish(b, z, want, n.name)


def conv_spatial_reduction(graph: Graph, n: OpNode) -> _Hit | None:
    """sum / mean over every spatial dim of a convolution or transposed convolution -> computed
    from box sums of its input, without the convolution (over some spatial dims only: a
    convolution over the others, `_conv_partial_reduction`).

    Precondition: `n` is a float sum or mean over dims D (spatial dims, optionally the batch or
    channel dim too) of an `aten.convolution` read only by `n`, its input, weight, bias and
    result of one dtype, and along every spatial dim the taps that read input elements form one
    contiguous range.
    Proof (one spatial dim; the dims are independent, so the sums nest): a convolution computes
    y[n, co, o] = b[co] + sum_{ci, k} w[co, ci, k] * x[n, ci, o*s + k*d - p] (zero outside x), so
    sum_o y[n, co, o] = P * b[co] + sum_{ci, k} w[co, ci, k] * S[n, ci, k] with
    S[n, ci, k] = sum_o x[n, ci, o*s + k*d - p]: the sum of x over the positions tap k reads, a
    window of stride s (its part in the zero padding adds nothing). A transposed convolution sends
    x[n, ci, i] to output i*s + k*d - p through w[ci, co, k]; summed over all outputs, tap k
    collects every input element whose target lies inside the output (the window of i with
    0 <= i*s + k*d - p < O: padding and output_padding crop it), so the same formula holds with
    w[ci, co, k]. The windows of one phase overlap in a core summed once; each window adds its
    strips. Taps reading only padding have S = 0 and are dropped with their weights. The
    contraction over (ci, k) is a matrix product (groups = 1) or, per group, a product and a sum;
    a mean divides by P = the number of output positions. Exact in real arithmetic: the same
    products w * x summed in another order (rounding of a reassociated sum). S reads exactly the
    elements the convolution reads, so NaN propagates as in the original; for infinities in x the
    weights are the factor pulled out of the sums, so with finite weights the result is the
    original's (+-inf or NaN alike), barring overflow."""
    red = _sum_mean(graph, n)
    if red is None or n.name in graph.mutations:
        return None
    kind, v, dims, keep = red
    conv = graph.producer(v)
    if conv is None or conv.target != "aten.convolution.default" or len(conv.args) != 9 \
            or not _only_reader(graph, v.name, n.name):
        return None
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
    om, want = _out(conv), _out(n)
    rank = len(om.shape)
    if rank < 3 or not set(range(2, rank)) & set(dims) or not isinstance(x, Ref) or not isinstance(w, Ref) \
            or not (bias is None or isinstance(bias, Ref)):
        return None
    xm, wm = _meta(graph, x), _meta(graph, w)
    if om.dtype not in FLOATS or xm.dtype != om.dtype or wm.dtype != om.dtype or len(xm.shape) != rank \
            or len(wm.shape) != rank or (bias is not None and _meta(graph, bias).dtype != om.dtype):
        return None
    nsp = rank - 2
    if not all(isinstance(t, (list, tuple)) and all(isinstance(i, int) for i in t) for t in (stride, padding, dilation)):
        return None
    strides, pads, dilations = ([int(i) for i in t] * (nsp if len(t) == 1 else 1) for t in (stride, padding, dilation))
    if not all(len(t) == nsp for t in (strides, pads, dilations)) or not isinstance(groups, int) or groups < 1 \
            or min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        return None
    summed = [j for j in range(nsp) if 2 + j in dims]  # the spatial dims reduced; the others stay a convolution
    if len(summed) < nsp:
        return _conv_partial_reduction(graph, n, conv, kind, dims, summed, strides, pads, dilations, output_padding)
    found = _reading_taps(xm, om, wm, range(nsp), strides, pads, dilations, bool(transposed))
    if found is None:
        return None
    live, windows = list(found[0].values()), list(found[1].values())
    nb, cin = xm.shape[:2]
    cout = om.shape[1]
    b = _Build(graph, _names(graph))
    try:
        t = x
        for j in reversed(range(nsp)):  # innermost dim first: its sums shrink the tensor the most
            sums = _window_sums(b, t, 2 + j, windows[j], f"{n.name}_box{j}")
            t = sums[0] if len(sums) == 1 else b(f"{n.name}_taps{j}", "aten.cat.default", sums, 2 + j)
        if b.meta(t).stride != contiguous_strides(b.meta(t).shape):  # (one window of one element: a slice of x)
            t = b(f"{n.name}_taps", "aten.clone.default", t, memory_format=torch.contiguous_format)
        wk = w
        for j, (lo, hi) in enumerate(live):
            if (lo, hi) != (0, wm.shape[2 + j]):
                wk = b(f"{w.name}_taps", "aten.slice.Tensor", wk, 2 + j, lo, hi)
        if b.meta(wk).stride != contiguous_strides(b.meta(wk).shape):
            wk = b(f"{w.name}_taps_contiguous", "aten.clone.default", wk, memory_format=torch.contiguous_format)
        taps = math.prod(hi - lo for lo, hi in live)
        cin_g = cin // groups
        if not transposed and groups == 1:
            rows = b(f"{n.name}_sums", "aten.view.default", t, [nb, cin * taps])
            wv = b(f"{w.name}_flat", "aten.view.default", wk, [cout, cin * taps])
            z = b(f"{n.name}_contract", "aten.mm.default", rows, b(f"{w.name}_flat_t", "aten.permute.default", wv, [1, 0]))
        elif transposed and groups == 1:
            rows = b(f"{n.name}_sums", "aten.view.default", t, [nb, cin * taps])
            wv = b(f"{w.name}_flat", "aten.view.default", wk, [cin, cout, taps])
            wt = b(f"{w.name}_flat_t", "aten.clone.default", b(f"{w.name}_tap_major", "aten.permute.default", wv, [0, 2, 1]),
                   memory_format=torch.contiguous_format)
            z = b(f"{n.name}_contract", "aten.mm.default", rows, b(f"{w.name}_rows", "aten.view.default", wt,
                                                                   [cin * taps, cout]))
        elif not transposed:
            rows = b(f"{n.name}_sums", "aten.view.default", t, [nb, groups, 1, cin_g * taps])
            wv = b(f"{w.name}_flat", "aten.view.default", wk, [groups, cout // groups, cin_g * taps])
            z = b(f"{n.name}_contract", "aten.sum.dim_IntList", b(f"{n.name}_products", "aten.mul.Tensor", rows, wv),
                  [3], False)
            z = b(f"{n.name}_channels", "aten.view.default", z, [nb, cout])
        else:
            rows = b(f"{n.name}_sums", "aten.view.default", t, [nb, groups, cin_g, 1, taps])
            wv = b(f"{w.name}_flat", "aten.view.default", wk, [groups, cin_g, cout // groups, taps])
            z = b(f"{n.name}_contract", "aten.sum.dim_IntList", b(f"{n.name}_products", "aten.mul.Tensor", rows, wv),
                  [2, 4], False)
            z = b(f"{n.name}_channels", "aten.view.default", z, [nb, cout])
        z = _as_reduction(b, n, z, kind, math.prod(om.shape[2:]), bias, [cout], dims, want)
    except _Skip:
        return None
    what = "transposed convolution" if transposed else "convolution"
    return _Hit(b.nodes, z.name, f"{n.op} over the spatial dims of the {what} ({conv.name}) from box sums of its "
                                 f"input {x.name} and its weight {w.name}; the {what} is removed")


def _conv_partial_reduction(graph: Graph, n: OpNode, conv: OpNode, kind: str, dims, summed: list[int],
                            strides, pads, dilations, output_padding) -> _Hit | None:
    """conv_spatial_reduction's case of a sum / mean over some spatial dims R of a (transposed)
    convolution, the other spatial dims K kept: a convolution over K alone.

    Proof: along R the sums nest as in conv_spatial_reduction, so with S[n, ci, k_R, :] the sum of x
    over the R-window tap k_R reads,
    sum_{o_R} y[n, co, o_R, o_K] = P_R * b[co] + sum_{k_R} sum_{ci, k_K} w[co, ci, k_R, k_K] * S[n, ci, k_R, o_K s + k_K d - p],
    which is one convolution over K of the input whose channels are the pairs (ci, k_R) (ci outer, so
    a group's channels stay together) with the weight's R taps moved beside its input channels;
    stride, padding, dilation (and a transposed convolution's output padding) along K unchanged.
    Exact in real arithmetic (a reassociated sum); NaN and infinities as in conv_spatial_reduction.
    The fixed point keeps it only where it lowers the FLOPs: where the reduced extent outnumbers
    the R taps."""
    x, w, bias = conv.args[0], conv.args[1], conv.args[2]
    transposed, groups = bool(conv.args[6]), conv.args[8]
    om, want = _out(conv), _out(n)
    xm, wm = _meta(graph, x), _meta(graph, w)
    nsp = len(om.shape) - 2
    kept = [j for j in range(nsp) if j not in summed]
    out_pad = [int(i) for i in output_padding] * (nsp if len(output_padding) == 1 else 1) \
        if isinstance(output_padding, (list, tuple)) and all(isinstance(i, int) for i in output_padding) else None
    if out_pad is None or len(out_pad) != nsp:
        return None
    found = _reading_taps(xm, om, wm, summed, strides, pads, dilations, transposed)
    if found is None:
        return None
    live, windows = found
    nb, cin = xm.shape[:2]
    cout = om.shape[1]
    taps = math.prod(hi - lo for lo, hi in live.values())
    b = _Build(graph, _names(graph))
    try:
        t = x
        for j in reversed(summed):
            sums = _window_sums(b, t, 2 + j, windows[j], f"{n.name}_box{j}")
            t = sums[0] if len(sums) == 1 else b(f"{n.name}_taps{j}", "aten.cat.default", sums, 2 + j)
        order = [0, 1] + [2 + j for j in summed] + [2 + j for j in kept]
        t = b(f"{n.name}_taps", "aten.clone.default", b(f"{n.name}_taps_inner", "aten.permute.default", t, order),
              memory_format=torch.contiguous_format)
        t = b(f"{n.name}_channels", "aten.view.default", t, [nb, cin * taps] + [xm.shape[2 + j] for j in kept])
        wk = w
        for j, (lo, hi) in live.items():
            if (lo, hi) != (0, wm.shape[2 + j]):
                wk = b(f"{w.name}_taps", "aten.slice.Tensor", wk, 2 + j, lo, hi)
        # [Cout, Cin/g, k_R, k_K] -> [Cout, Cin/g * taps, k_K]; transposed: [Cin, k_R, Cout/g, k_K] -> [Cin * taps, ...]
        w_order = ([0, 1] + [2 + j for j in summed] if not transposed else [0] + [2 + j for j in summed] + [1]) \
            + [2 + j for j in kept]
        wk = b(f"{w.name}_taps_major", "aten.clone.default", b(f"{w.name}_taps_perm", "aten.permute.default", wk, w_order),
               memory_format=torch.contiguous_format)
        w_shape = [wm.shape[0], wm.shape[1] * taps] if not transposed else [wm.shape[0] * taps, wm.shape[1]]
        wk = b(f"{w.name}_taps_flat", "aten.view.default", wk, w_shape + [wm.shape[2 + j] for j in kept])
        z = b(f"{n.name}_conv", "aten.convolution.default", t, wk, None, [strides[j] for j in kept],
              [pads[j] for j in kept], [dilations[j] for j in kept], transposed, [out_pad[j] for j in kept], groups)
        if list(b.meta(z).shape) != [nb, cout] + [om.shape[2 + j] for j in kept]:
            raise _Skip("the convolution over the kept dims has another output size")
        z = _as_reduction(b, n, z, kind, math.prod(om.shape[2 + j] for j in summed), bias, [cout] + [1] * len(kept),
                          dims, want, keep=[nb, cout] + [1 if j in summed else om.shape[2 + j] for j in range(nsp)])
    except _Skip:
        return None
    what = "transposed convolution" if transposed else "convolution"
    over = ", ".join(str(2 + j) for j in summed)
    return _Hit(b.nodes, z.name, f"{n.op} over spatial dims {over} of the {what} ({conv.name}) as a {what} over "
                                 f"the other spatial dims of window sums of {x.name}; the {what} is removed")


# ---------------------------------------------------------------- the fixed point

#: The rules in the order they are tried (each at every node, in graph order): closed forms first,
#: then reductions moved through affine ops toward the product that makes them, then the products.
RULES = (size_one_logsumexp, size_one_reduction, size_one_max, size_one_softmax, size_one_norm,
         reduction_through_affine, reduction_through_eval_batch_norm,
         reduction_through_group_norm, linear_reduction, conv_spatial_reduction)


def _names(graph: Graph) -> set[str]:
    return {i.name for i in graph.inputs} | {n.name for n in graph.nodes}


def _base(graph: Graph, nodes: dict[str, OpNode], name: str) -> str:
    """The value a chain of views starting at `name` views."""
    while name in nodes and is_view(nodes[name]) and nodes[name].args and isinstance(nodes[name].args[0], Ref):
        name = nodes[name].args[0].name
    return name


def _splice(graph: Graph, old: OpNode, hit: _Hit) -> Graph:
    """`graph` with `old` replaced by `hit` (its nodes placed where `old` was), the nodes this
    leaves unread dropped. `old`'s name stays: it names the replacing node, or readers read the
    replacing value; a value the model returns is copied where it would view an input or another
    returned value."""
    new = list(hit.nodes)
    mapping: dict[str, str] = {}
    kept = _kept(graph)
    last = new[-1] if new and new[-1].name == hit.value else None
    if old.name in kept:
        everything = {**{n.name: n for n in graph.nodes}, **{n.name: n for n in new}}
        root = _base(graph, everything, hit.value)
        aliases = graph.is_input(root) or (root in kept and root != old.name) or hit.value not in {n.name for n in new}
        if last is not None and not (is_view(last) and aliases):
            new[-1] = OpNode(old.name, last.target, last.args, last.kwargs, last.outs)
        else:
            new.append(OpNode(old.name, "aten.clone.default", (Ref(hit.value),), {}, list(old.outs)))
    elif last is not None:
        new[-1] = OpNode(old.name, last.target, last.args, last.kwargs, last.outs)
    else:
        mapping[old.name] = hit.value
    nodes: list[OpNode] = []
    for n in graph.nodes:
        if n.name == old.name:
            nodes += new
            continue
        nodes.append(reading(n, mapping))
    unread_before = {n.name for n in graph.nodes} - {i for n in graph.nodes for i in n.inputs} - kept
    out = Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported)
    among = {n.name for n in nodes} - unread_before
    return Graph(graph.name, graph.inputs, drop_unread(out, nodes, among=among), list(graph.outputs),
                 dict(graph.mutations), graph.exported)


_NOTE = re.compile(r"^(?P<node>[^:]+): (?P<what>.*) \[(?P<rule>\w+): (?P<flops>-?[\d,]+) FLOPs removed\]$")


def note(node: str, what: str, rule: str, removed: int) -> str:
    """The line of one applied rewrite (in result.json's "rewrites"; `parse_note` reads it back)."""
    return f"{node}: {what} [{rule}: {removed:,} FLOPs removed]"


def parse_note(line: str) -> dict | None:
    """(node, what, rule, flops_removed) of a line `note` wrote, else None (another rewrite's line)."""
    m = _NOTE.match(line) if isinstance(line, str) else None
    if m is None:
        return None
    return {"node": m["node"], "what": m["what"], "rule": m["rule"], "flops_removed": int(m["flops"].replace(",", ""))}


def _better(after, before) -> bool:
    return after.flops < before.flops or (after.flops == before.flops and after.bytes < before.bytes)


def algebra(graph: Graph) -> tuple[Graph, list[str]]:
    """`graph` with the rules in RULES applied until none fires, and one line per applied rewrite
    (the node, what it became, the FLOPs it removed). A rewrite that would not lower the FLOPs (or,
    at equal FLOPs, the minimum bytes) is not applied."""
    notes: list[str] = []
    cost = graph_cost(graph)
    refused: set[tuple[str, str]] = set()
    for _ in range(MAX_REWRITES):
        applied = False
        for rule in RULES:
            for n in graph.nodes:
                if (rule.__name__, n.name) in refused:
                    continue
                try:
                    hit = rule(graph, n)
                except _Skip:
                    hit = None
                if hit is None:
                    continue
                rewritten = _splice(graph, n, hit)
                after = graph_cost(rewritten)
                if not _better(after, cost):
                    refused.add((rule.__name__, n.name))
                    continue
                notes.append(note(n.name, hit.what, rule.__name__, cost.flops - after.flops))
                graph, cost, applied = rewritten, after, True
                refused.clear()
                break
            if applied:
                break
        if not applied:
            break
    return graph, notes
