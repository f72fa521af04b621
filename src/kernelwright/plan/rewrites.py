"""Exact graph rewrites applied before fusion planning.

Only rewrites that are exact in real arithmetic: removing ops that return their input's value
(a clone of a contiguous tensor, an alias, an expand or view to the same shape, a cast to the same
dtype, multiplying or dividing by 1, adding or subtracting 0). A rewrite never touches a value the
model returns or a buffer it updates, so outputs never alias inputs.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref


def _is_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _is_zero(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


def noop_source(graph: Graph, n: OpNode) -> str | None:
    """The value `n` merely passes on, or None when `n` computes something."""
    if not n.args or not isinstance(n.args[0], Ref) or n.meta is None:
        return None
    src = n.args[0].name
    m = graph.meta(src)
    if m is None or m.shape != n.meta.shape or m.dtype != n.meta.dtype:
        return None
    t = n.target
    if t == "aten.alias.default":
        return src
    if t == "aten.clone.default":
        fmt = n.kwargs.get("memory_format")
        return src if m.contiguous and (fmt is None or str(fmt) == "torch.contiguous_format") else None
    if t in ("aten.expand.default", "aten.view.default", "aten._unsafe_view.default"):
        return src if m.stride == n.meta.stride else None
    if t == "aten._to_copy.default":
        allowed = {"dtype", "device", "layout", "memory_format"}
        if set(n.kwargs) - allowed or n.kwargs.get("memory_format") not in (None,) or m.stride != n.meta.stride:
            return None
        return src
    if len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1:
        if t in ("aten.mul.Tensor", "aten.div.Tensor") and _is_one(n.args[1]):
            return src
        if t in ("aten.add.Tensor", "aten.sub.Tensor") and _is_zero(n.args[1]):
            return src
    return None


def _replace(value, mapping: dict[str, str]):
    if isinstance(value, Ref):
        return Ref(mapping.get(value.name, value.name))
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, mapping) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, mapping) for k, v in value.items()}
    return value


def simplify(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph without no-op nodes, and one line per removed node."""
    keep_values = set(graph.outputs) | set(graph.mutations)
    mapping: dict[str, str] = {}
    removed: list[str] = []
    nodes: list[OpNode] = []
    for n in graph.nodes:
        n = OpNode(n.name, n.target, _replace(n.args, mapping), _replace(n.kwargs, mapping), n.outs, n.fx)
        src = None if n.name in keep_values else noop_source(graph, n)
        if src is not None:
            mapping[n.name] = src
            removed.append(f"{n.name}: {n.target} returns its input {src} unchanged")
        else:
            nodes.append(n)
    if not removed:
        return graph, []
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), removed
