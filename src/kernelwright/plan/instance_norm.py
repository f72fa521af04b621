"""Instance norm over its own dims: torch lowers `F.instance_norm` (without affine parameters or
running statistics) to a batch norm over a [1, N * C, *spatial] view of the [N, C, *spatial]
input and a view back. A fusion group over that view's domain cannot read a per-channel operand
of the input (a bias added before the norm: its channel is the merged dim's index modulo C), and a
channels-last input has no such view at all. The same values as mean and biased variance over the
spatial dims of the input itself keep the group on the input's own domain.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, rebuilt

_VIEWS = ("aten.view.default", "aten._unsafe_view.default")
_BN = "aten._native_batch_norm_legit.no_stats"


def _match(graph: Graph, view: OpNode):
    """(input, batch norm, getitem, view back) when `view` starts the lowered instance norm of a
    float value: [N, C, *S] viewed as [1, N * C, *S], a training-mode batch norm without weight,
    bias or running statistics read only through its first output, viewed back to [N, C, *S]."""
    if view.target not in _VIEWS or not isinstance(view.args[0], Ref) or view.meta is None:
        return None
    x = graph.meta(view.args[0].name)
    if x is None or len(x.shape) < 3 or tuple(view.meta.shape) != (1, x.shape[0] * x.shape[1], *x.shape[2:]):
        return None
    users = graph.users(view.name)
    if len(users) != 1 or users[0].target != _BN:
        return None
    bn = users[0]
    if bn.args[0] != Ref(view.name) or bn.args[1] is not None or bn.args[2] is not None or not bn.args[3]:
        return None
    reads = graph.users(bn.name)
    if len(reads) != 1 or reads[0].target != "getitem" or reads[0].args[1] != 0:
        return None
    back = graph.users(reads[0].name)
    if len(back) != 1 or back[0].target not in _VIEWS or tuple(back[0].meta.shape) != tuple(x.shape):
        return None
    if any(v in graph.outputs or v in graph.mutations for v in (view.name, bn.name, reads[0].name)):
        return None
    return view.args[0].name, bn, reads[0], back[0]


def instance_norm_rows(graph: Graph) -> tuple[Graph, list[str]]:
    """Each lowered instance norm (`_match`) as mean and biased variance over the spatial dims of
    its input, y = (x - mean) * rsqrt(var + eps), named as the view back so its readers are
    unchanged. Exact in real arithmetic: the batch norm normalises each of the N * C rows of the
    view by its own mean and biased variance, which are those of one (n, c) plane of the input."""
    found = {}
    for n in graph.nodes:
        m = _match(graph, n)
        if m is not None:
            found[n.name] = m
    if not found:
        return graph, []
    drop = {v for view, (_, bn, item, _) in found.items() for v in (view, bn.name, item.name)}
    replace = {back.name: (view, x, bn) for view, (x, bn, _, back) in found.items()}
    notes: list[str] = []

    def lower(n, match, nodes):
        view, x, bn = match
        xm = graph.meta(x)
        dims = list(range(2, len(xm.shape)))
        row = TensorMeta.dense(tuple(xm.shape[:2]) + (1,) * len(dims), xm.dtype)
        full = TensorMeta(tuple(xm.shape), tuple(xm.stride), xm.dtype)

        def op(suffix, target, args, meta, kwargs=None):
            nodes.append(OpNode(f"{n.name}_{suffix}", target, tuple(args), kwargs or {}, [meta]))
            return Ref(nodes[-1].name)

        mean = op("mean", "aten.mean.dim", (Ref(x), dims, True), row)
        var = op("var", "aten.var.correction", (Ref(x), dims), row, {"correction": 0, "keepdim": True})
        centred = op("centred", "aten.sub.Tensor", (Ref(x), mean), full)
        rstd = op("rstd", "aten.rsqrt.default", [op("var_eps", "aten.add.Tensor", (var, float(bn.args[5])), row)], row)
        nodes.append(OpNode(n.name, "aten.mul.Tensor", (centred, rstd), {}, [n.meta], n.fx))
        notes.append(f"{n.name}: instance norm of {x} over its spatial dims (not a batch norm over a "
                     f"[1, N*C, ...] view, {view})")

    nodes = rebuilt(graph.nodes, drop, replace, lower)
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
