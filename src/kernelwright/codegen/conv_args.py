"""Argument checks shared by the convolution node templates."""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta

CONV = "aten.convolution.default"


def float32_conv2d(graph: Graph, node: OpNode, dtypes: tuple[str, ...] = ("float32",)) -> tuple[TensorMeta, TensorMeta] | str:
    """(input meta, weight meta) of a 2-D convolution with tensor operands of one dtype in `dtypes`
    (float32 unless told), else why not."""
    if node.target != CONV:
        return "not a convolution"
    x, w, b = node.args[0], node.args[1], node.args[2]
    if not (isinstance(x, Ref) and isinstance(w, Ref)) or (b is not None and not isinstance(b, Ref)):
        return "operands are not tensor values"
    xm, wm = graph.meta(x.name), graph.meta(w.name)
    if xm is None or wm is None or len(xm.shape) != 4 or xm.dtype not in dtypes or wm.dtype != xm.dtype:
        return f"only 4-D {' or '.join(dtypes)} (2-D convolution) inputs of one dtype"
    return xm, wm
