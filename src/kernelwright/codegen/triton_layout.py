"""A node template for layout copies: `clone(x, memory_format=...)` between the contiguous (NCHW)
and channels-last (NHWC / NDHWC) layouts of a 4-D / 5-D tensor, or `_to_copy(x, dtype=...,
memory_format=...)` that also casts between float dtypes (bf16 operands of a channels-last
convolution in one pass), as a tiled Triton transpose (templates/triton/layout_copy.py.j2),
searched against torch's copy.

The channels-last rewrite (plan/rewrites.py) inserts such copies before convolutions under the
tf32 / bf16 policies; a plain strided copy reads or writes across the channels.
"""
from __future__ import annotations

import math

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode
from kernelwright.capture.shapes import channels_last_strides, contiguous_strides
from kernelwright.codegen.node_kernels import NodeKernel, OneTensorOp
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
from kernelwright.space.axes import Axis, Space
from kernelwright.space.config import Config

NAME = "triton.layout_copy"
DTYPES = ("float32", "float16", "bfloat16")


def _ncs(shape, stride) -> tuple[int, int, int] | None:
    """(stride of N, of C, of the flattened spatial dims) when the spatial dims merge into one."""
    sp = list(zip(shape[2:], stride[2:]))
    for (_, outer), (size, inner) in zip(sp, sp[1:]):
        if outer != size * inner:
            return None
    return stride[0], stride[1], sp[-1][1]


class LayoutCopyTemplate(OneTensorOp):
    name = NAME

    TARGETS = ("aten.clone.default", "aten._to_copy.default")
    KIND = "clone or cast"

    def check(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target == "aten._to_copy.default" and not set(node.kwargs) <= {"dtype", "memory_format"}:
            return "a cast with more than a dtype and a memory format"
        x, y = graph.meta(node.args[0].name), node.meta
        if x is None or y is None or len(x.shape) not in (4, 5) or x.dtype not in DTYPES or y.dtype not in DTYPES:
            return "only 4-D / 5-D floating tensors"
        layouts = {contiguous_strides(x.shape), channels_last_strides(x.shape)}
        if x.stride not in layouts or y.stride not in layouts or x.stride == y.stride:
            return "not a copy between the contiguous and channels-last layouts"
        return None

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        return Space(NAME, [Axis("BLOCK_C", [16, 32, 64]), Axis("BLOCK_S", [32, 64, 128]), Axis("num_warps", [2, 4, 8])],
                     [lambda c: 4 <= c["BLOCK_C"] * c["BLOCK_S"] // (32 * c["num_warps"]) <= 64]).configs()

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        """32 channels x 64 positions (8 KB of float32) with 4 warps: 16 elements a thread."""
        return Config.make(NAME, BLOCK_C=32, BLOCK_S=64, num_warps=4)

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        x, y = graph.meta(node.args[0].name), node.meta
        direction = "channels-last" if y.stride == channels_last_strides(y.shape) else "contiguous"
        text = triton_template("layout_copy.py.j2").render(
            node=node.name, target=node.target, input=node.args[0].name, dtype=x.dtype, out_dtype=y.dtype,
            shape=tuple(x.shape),
            in_stride=tuple(x.stride), out_stride=tuple(y.stride), direction=direction, N=x.shape[0],
            C=x.shape[1], S=math.prod(x.shape[2:]), xs=_ncs(x.shape, x.stride), ys=_ncs(y.shape, y.stride),
            kernel=f"{node.name}_layout_kernel",
            **{k: int(config[k]) for k in ("BLOCK_C", "BLOCK_S", "num_warps")})
        return NodeKernel(with_helpers(text), [node.args[0].name], 1)


TEMPLATE = LayoutCopyTemplate()
