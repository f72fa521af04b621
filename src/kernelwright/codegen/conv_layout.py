"""A node template for 2-D convolutions: cuDNN in the channels-last (NHWC) layout.

Not a new kernel but an exact layout rewrite, searched and verified like every other candidate:
the library call in NCHW stays the baseline, and this variant only wins when measured faster.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.conv_args import float32_conv2d
from kernelwright.codegen.node_kernels import NodeKernel, OneConfig
from kernelwright.codegen.templating import triton_template

NAME = "torch.conv_channels_last"


class ConvLayoutTemplate(OneConfig):
    name = NAME
    CONFIG = {"layout": "channels_last"}

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        metas = float32_conv2d(graph, node)
        if isinstance(metas, str):
            return metas
        xm, wm = metas
        if not xm.contiguous or not wm.contiguous:
            return "the input is not in the default layout"
        return None

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args
        args = ["x", "w"] + (["b"] if isinstance(b, Ref) else [])
        inputs = [x.name, w.name] + ([b.name] if isinstance(b, Ref) else [])
        text = triton_template("conv_layout.py.j2").render(
            node=node.name, target=node.target, args=args, bias="b" if isinstance(b, Ref) else "None",
            stride=list(stride), padding=list(padding), dilation=list(dilation), transposed=bool(transposed),
            output_padding=list(output_padding), groups=int(groups),
            input_shape=list(graph.meta(x.name).shape), weight_shape=list(graph.meta(w.name).shape))
        return NodeKernel(text, inputs, 1)


TEMPLATE = ConvLayoutTemplate()
