"""Argument checks shared by the convolution node templates."""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta

CONV = "aten.convolution.default"


def float32_conv2d(graph: Graph, node: OpNode) -> tuple[TensorMeta, TensorMeta] | str:
    """(input meta, weight meta) of a 2-D float32 convolution with tensor operands, else why not."""
    if node.target != CONV:
        return "not a convolution"
    x, w, b = node.args[0], node.args[1], node.args[2]
    if not (isinstance(x, Ref) and isinstance(w, Ref)) or (b is not None and not isinstance(b, Ref)):
        return "operands are not tensor values"
    xm, wm = graph.meta(x.name), graph.meta(w.name)
    if xm is None or wm is None or len(xm.shape) != 4 or xm.dtype != "float32" or wm.dtype != "float32":
        return "only 4-D float32 (2-D convolution) inputs"
    return xm, wm
