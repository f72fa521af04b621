"""A node template for depthwise 2-D convolutions (groups == input channels): a direct Triton
kernel (templates/triton/depthwise_conv2d.py.j2) with the bias fused, searched against cuDNN.

Each program owns BLOCK_M output pixels of one image (BLOCK_M // BLOCK_W rows of BLOCK_W columns) by
BLOCK_N channels and sums the KH * KW taps with float32 multiply-adds (no tensor cores). Operands are
float32, or bf16 under the bf16 policy (as autocast runs the conv; the result is then stored in bf16,
rounded to nearest even).
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.epilogue import IDENTITY, bias
from kernelwright.codegen.conv_args import float32_conv2d
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.templating import triton_env
from kernelwright.codegen.triton_gemm import depthwise_space, render_depthwise
from kernelwright.space.config import Config

NAME = "triton.depthwise"


class DepthwiseTemplate:
    name = NAME

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        metas = float32_conv2d(graph, node, dtypes=("float32", "bfloat16"))
        if isinstance(metas, str):
            return metas
        xm, wm = metas
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args
        if transposed or int(groups) != xm.shape[1] or wm.shape[1] != 1 or wm.shape[0] % xm.shape[1]:
            return "not a depthwise convolution (groups == input channels, weight [C*mult, 1, KH, KW])"
        if len(padding) != 2 or any(not isinstance(p, int) for p in padding):
            return "padding is not numeric"
        return None

    def space(self, graph: Graph, node: OpNode) -> list[Config]:
        C = graph.meta(node.args[1].name).shape[0]
        OW = graph.meta(node.name).shape[-1]
        return [Config.make(NAME, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_W=c["BLOCK_W"],
                            num_warps=c["num_warps"])
                for c in depthwise_space(C=C, OW=OW)]

    def default(self, graph: Graph, node: OpNode) -> Config:
        """NCHW: pixels are contiguous, so a long pixel tile (256) over few channels (4), 4 warps."""
        return Config.make(NAME, BLOCK_M=256, BLOCK_N=4, num_warps=4)

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        x, w, b, stride, padding, dilation = node.args[:6]
        has_bias = isinstance(b, Ref)
        text = render_depthwise(bias("bias") if has_bias else IDENTITY, name=f"{node.name}_dw")
        args = ["x", "w"] + (["bias"] if has_bias else [])
        adapter = triton_env().get_template("depthwise_node.py.j2").render(
            node=node.name, target=node.target, args=args, bias=has_bias, stride=tuple(stride),
            padding=tuple(padding), dilation=tuple(dilation), input_shape=list(graph.meta(x.name).shape),
            weight_shape=list(graph.meta(w.name).shape), BLOCK_W=int(config.get("BLOCK_W") or 0) or None,
            **{k: int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps")})
        inputs = [x.name, w.name] + ([b.name] if has_bias else [])
        return NodeKernel(text + adapter, inputs, 1)


TEMPLATE = DepthwiseTemplate()
