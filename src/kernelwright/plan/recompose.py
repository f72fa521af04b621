"""Activations that torch.export's decompositions spell out, put back together as one ATen op.

Export lowers `F.mish(x)` (and `x * torch.tanh(F.softplus(x))` written by hand) to
exp, log1p, gt, where, tanh and mul: in the generated code three transcendental functions and
two divisions per element. As one op, `aten.mish`, the op table computes it with one exponential
and one division (codegen `kw_mish`): the same function, rounded differently, which verification
bounds like any other kernel's. A fused epilogue of two such activations after a convolution is
bound by that arithmetic, not by memory, so the saving is the kernel's time.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.plan.dead_code import drop_unread

MISH_THRESHOLD = 20  # softplus's default threshold, the one aten.mish uses


def _producer(graph: Graph, v, target: str) -> OpNode | None:
    """The node computing `v` when it is a `target` call without keyword arguments, else None."""
    n = graph.producer(v)
    return n if n is not None and n.target == target and not n.kwargs else None


def softplus_input(graph: Graph, v) -> tuple[Ref, set[str]] | None:
    """(x, the names of the nodes that compute it) where `v` is softplus(x) at beta 1 and
    threshold 20 as decomposed: where(x > 20, x, log1p(exp(x))); else None."""
    w = _producer(graph, v, "aten.where.self")
    if w is None or len(w.args) != 3:
        return None
    cond, x, rest = w.args
    gt = _producer(graph, cond, "aten.gt.Scalar")
    log1p = _producer(graph, rest, "aten.log1p.default")
    if gt is None or log1p is None or not isinstance(x, Ref) or gt.args != (x, MISH_THRESHOLD):
        return None
    exp = _producer(graph, log1p.args[0], "aten.exp.default")
    if exp is None or exp.args != (x,):
        return None
    return x, {w.name, gt.name, log1p.name, exp.name}


def mish_input(graph: Graph, n: OpNode) -> tuple[Ref, set[str]] | None:
    """(x, the names of the nodes between x and `n`) where `n` is x * tanh(softplus(x)), either
    operand order; else None."""
    if n.target != "aten.mul.Tensor" or n.kwargs or len(n.args) != 2:
        return None
    for x, other in (n.args, n.args[::-1]):
        tanh = _producer(graph, other, "aten.tanh.default")
        found = softplus_input(graph, tanh.args[0]) if tanh is not None else None
        if found is not None and found[0] == x:
            return x, found[1] | {tanh.name}
    return None


def recompose_mish(graph: Graph) -> tuple[Graph, list[str]]:
    """Every decomposed mish as one `aten.mish` node (the mul's name and metadata); the pieces
    nothing else reads are dropped, those that others read (a value returned, or saved for a
    backward) stay."""
    nodes, notes, pieces = [], [], set()
    for n in graph.nodes:
        found = mish_input(graph, n)
        if found is None:
            nodes.append(n)
            continue
        x, between = found
        nodes.append(OpNode(n.name, "aten.mish.default", (x,), {}, n.outs))
        pieces |= between
        notes.append(f"{n.name}: x * tanh(softplus(x)) of {x.name} computed as one mish")
    if not notes:
        return graph, []
    nodes = drop_unread(graph, nodes, among=pieces)
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
