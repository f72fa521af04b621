"""The iteration domain and reduced dims of a fusible reduction or row composite.

`reduction_spec` decides whether a reduction joins a fusion group (plan.fusion) and how a
group kernel iterates it (codegen); `row_shapes` gives the shapes of its per-row values.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode
from kernelwright.ops.targets import FLOAT_DTYPES


def _norm_dims(dims, ndim: int) -> tuple[int, ...]:
    if dims is None or dims == [] or dims == ():
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(d % ndim for d in dims))


def reduction_spec(node: OpNode, graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """(domain, reduced dims, keepdim) of a reduction or row composite; None if not fusible."""
    x = node.args[0]
    meta = graph.meta(x.name) if hasattr(x, "name") else None
    if meta is None or meta.dtype not in FLOAT_DTYPES or len(meta.shape) == 0:
        return None
    ndim = len(meta.shape)
    t, a = node.target, node.args
    if t in ("aten.sum.default", "aten.mean.default"):
        return meta.shape, tuple(range(ndim)), False
    if t in ("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default"):
        dims = a[1] if len(a) > 1 else node.kwargs.get("dim")
        keep = a[2] if len(a) > 2 else node.kwargs.get("keepdim", False)
        if node.kwargs.get("dtype") is not None:
            return None
        return meta.shape, _norm_dims(dims, ndim), bool(keep)
    if t in ("aten.argmax.default", "aten.argmin.default", "aten.max.dim", "aten.min.dim"):
        dim = a[1] if len(a) > 1 else node.kwargs.get("dim")
        keep = a[2] if len(a) > 2 else node.kwargs.get("keepdim", False)
        if dim is None:
            return None
        return meta.shape, _norm_dims(dim, ndim), bool(keep)
    if t == "aten.var.correction":
        dims = a[1] if len(a) > 1 else node.kwargs.get("dim")
        return meta.shape, _norm_dims(dims, ndim), bool(node.kwargs.get("keepdim", False))
    if t == "aten.linalg_vector_norm.default":
        order = a[1] if len(a) > 1 else node.kwargs.get("ord", 2)
        if float(order) not in (1.0, 2.0):
            return None
        dims = a[2] if len(a) > 2 else node.kwargs.get("dim")
        keep = a[3] if len(a) > 3 else node.kwargs.get("keepdim", False)
        return meta.shape, _norm_dims(dims, ndim), bool(keep)
    if t in ("aten._softmax.default", "aten._log_softmax.default"):
        return meta.shape, _norm_dims(a[1], ndim), True
    if t == "aten.native_layer_norm.default":
        k = len(a[1])
        return meta.shape, tuple(range(ndim - k, ndim)), True
    if t == "aten.native_group_norm.default":
        n, c, hw, groups = (int(v) for v in a[3:7])
        if c % groups or n * c * hw != meta.numel:
            return None
        return (n, groups, c // groups, hw), (2, 3), True  # the input seen as [N, G, C/G, H*W]
    if t == "aten._native_batch_norm_legit.no_stats":
        if ndim < 2 or not a[3]:
            return None
        return meta.shape, tuple(d for d in range(ndim) if d != 1), True
    if t == "aten._native_batch_norm_legit_functional.default":
        if ndim < 2 or not a[5]:  # training mode: statistics over every dim but the channels
            return None
        return meta.shape, tuple(d for d in range(ndim) if d != 1), True
    return None


def row_shapes(domain, rdims) -> tuple[tuple[int, ...], tuple[int, ...]]:
    keep = tuple(1 if i in rdims else s for i, s in enumerate(domain))
    drop = tuple(s for i, s in enumerate(domain) if i not in rdims)
    return keep, drop
