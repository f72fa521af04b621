"""A node template for depthwise 2-D convolutions (groups == input channels): a direct Triton
kernel (templates/triton/depthwise_conv2d.py.j2) with the bias fused, searched against cuDNN.

Each program owns BLOCK_M output pixels of one image (BLOCK_M // BLOCK_W rows of BLOCK_W columns) by
BLOCK_N channels and sums the KH * KW taps with float32 multiply-adds (no tensor cores); for kernels
of 2 to 7 rows and 1 to 7 columns at row stride and dilation 1 a row-streaming variant (ROWS > 0)
walks the input rows once, keeping KH output rows' sums and the KH * KW weights in registers.
Operands are float32, or bf16 under the bf16 policy (as autocast runs the conv; the result is then
stored in bf16, rounded to nearest even). Under bf16 the cast of a model input that this conv alone
reads is absorbed: the kernel reads the float32 input and rounds each value to bf16 as it loads it
(the same numbers, without the cast kernel's pass over memory).
"""
from __future__ import annotations

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.epilogue import IDENTITY, bias
from kernelwright.codegen.conv_args import float32_conv2d
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
from kernelwright.codegen.triton_gemm import render_depthwise, rows_kernel
from kernelwright.plan.rewrites import plain_cast
from kernelwright.plan.weights import weight_roots
from kernelwright.space.config import Config
from kernelwright.space.gemm_space import depthwise_rows_space, depthwise_space

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

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        """Pixel-tile configs, and where the kernel has 2 to 7 rows and at most 7 columns at row
        stride and dilation 1 the row-streaming kernel's (ROWS > 0); the same on every device."""
        C = graph.meta(node.args[1].name).shape[0]
        OW = graph.meta(node.name).shape[-1]
        tiles = [Config.make(NAME, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_W=c["BLOCK_W"],
                             num_warps=c["num_warps"])
                 for c in depthwise_space(C=C, OW=OW)]
        return tiles + self._rows_configs(graph, node)

    def _rows_configs(self, graph: Graph, node: OpNode) -> list[Config]:
        kernel = self._rows_kernel(graph, node)
        if kernel is None:
            return []
        C = graph.meta(node.args[1].name).shape[0]
        OW = graph.meta(node.name).shape[-1]
        return [Config.make(NAME, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], ROWS=c["ROWS"], num_warps=c["num_warps"])
                for c in depthwise_rows_space(C=C, OW=OW, KH=kernel[0])]

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        """NCHW: pixels are contiguous, so a long pixel tile (256) over few channels (4), 4 warps."""
        return Config.make(NAME, BLOCK_M=256, BLOCK_N=4, num_warps=4)

    def seeds(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        """The default, then (where it applies) the row-streaming kernel's first config: the search
        times both families before its cost model ranks the rest."""
        return [self.default(graph, node, spec)] + self._rows_configs(graph, node)[:1]

    @staticmethod
    def _rows_kernel(graph: Graph, node: OpNode) -> tuple[int, int] | None:
        """(KH, KW) when the row-streaming kernel applies (triton_gemm.rows_kernel), else None."""
        return rows_kernel(graph.meta(node.args[1].name).shape[2:], node.args[3], node.args[5])

    def absorbed(self, graph: Graph, node: OpNode) -> tuple[list[str], list[str], str] | None:
        """The bf16 policy's cast (float32 -> bf16) of a model input the conv reads, when this conv is
        the cast's only reader and the cast is not a model output: ([cast, conv], the values the
        kernel reads, the conv), else None. A cast of a computed value is left to the group that
        computes it (that kernel then writes bf16, half the bytes; its float32 value may never be
        written at all); casts of weights run once per weight version anyway."""
        x = node.args[0]
        if not isinstance(x, Ref) or graph.is_input(x.name) or x.name in graph.outputs:
            return None
        cast = graph.node(x.name)
        if not plain_cast(graph, cast) or cast.meta.dtype != "bfloat16" \
                or not graph.is_input(cast.args[0].name) or graph.meta(cast.args[0].name).dtype != "float32" \
                or [u.name for u in graph.users(x.name)] != [node.name] or x.name in weight_roots(graph):
            return None
        rest = [a.name for a in node.args[1:3] if isinstance(a, Ref)]
        return [cast.name, node.name], [cast.args[0].name] + rest, node.name

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        x, w, b, stride, padding, dilation = node.args[:6]
        has_bias = isinstance(b, Ref)
        pattern = self.absorbed(graph, node)
        text = render_depthwise(bias("bias") if has_bias else IDENTITY, name=f"{node.name}_dw",
                                rows_kernel=self._rows_kernel(graph, node))
        args = ["x", "w"] + (["bias"] if has_bias else [])
        adapter = triton_template("depthwise_node.py.j2").render(
            node=node.name, target=node.target, args=args, bias=has_bias, stride=tuple(stride),
            padding=tuple(padding), dilation=tuple(dilation), input_shape=list(graph.meta(x.name).shape),
            weight_shape=list(graph.meta(w.name).shape), BLOCK_W=int(config.get("BLOCK_W") or 0) or None,
            out_dtype=node.meta.dtype, round_x=pattern is not None, ROWS=int(config.get("ROWS") or 0),
            **{k: int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps")})
        inputs = pattern[1] if pattern else [x.name, w.name] + ([b.name] if has_bias else [])
        return NodeKernel(with_helpers(text + adapter), inputs, 1)


TEMPLATE = DepthwiseTemplate()
