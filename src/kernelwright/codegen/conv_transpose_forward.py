"""A node template for stride-1 transposed convolutions: cuDNN's forward convolution with the
kernel flipped and its channel axes swapped.

With stride 1 a transposed convolution is the forward convolution of the same input with the
flipped kernel and padding d * (k - 1) - p per axis: y[o] = sum_k x[o - k d + p] w[k]
= sum_k' x[o + k' d - P] w[K - 1 - k'] with P = d (K - 1) - p (exact in real arithmetic). cuDNN runs
the two through different kernels (the transposed one as a data gradient); this variant only wins
where it measures faster, like every other candidate.
"""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.conv_args import CONV
from kernelwright.codegen.node_kernels import NodeKernel, OneConfig
from kernelwright.codegen.templating import triton_template

NAME = "torch.conv_transpose_as_conv"


def _ints(v, nd: int) -> list[int]:
    return [int(v)] * nd if isinstance(v, int) else [int(x) for x in v]


class ConvTransposeForwardTemplate(OneConfig):
    name = NAME
    CONFIG = {"form": "forward"}

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target != CONV or len(node.args) < 9:
            return "not a convolution"
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args[:9]
        if not transposed:
            return "not a transposed convolution"
        if not (isinstance(x, Ref) and isinstance(w, Ref)) or (b is not None and not isinstance(b, Ref)):
            return "operands are not tensor values"
        xm, wm = graph.meta(x.name), graph.meta(w.name)
        if xm is None or wm is None or node.meta is None or not 3 <= len(xm.shape) <= 5 \
                or xm.dtype not in ("float16", "bfloat16", "float32", "float64") or wm.dtype != xm.dtype:
            return "only 1-3-D floating-point convolutions with operands of one dtype"
        nd = len(xm.shape) - 2
        k = list(wm.shape[2:])
        if _ints(stride, nd) != [1] * nd or _ints(output_padding, nd) != [0] * nd:
            return "stride or output_padding other than 1 / 0: not one forward convolution"
        if any(p > d * (kk - 1) for p, d, kk in zip(_ints(padding, nd), _ints(dilation, nd), k)):
            return "padding wider than the dilated kernel: the forward convolution would need negative padding"
        return None

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        x, w, b, _, padding, dilation, _, _, groups = node.args[:9]
        xm, wm, ym = graph.meta(x.name), graph.meta(w.name), node.meta
        nd = len(xm.shape) - 2
        k = list(wm.shape[2:])
        pad = [d * (kk - 1) - p for p, d, kk in zip(_ints(padding, nd), _ints(dilation, nd), k)]
        fmt = {4: "torch.channels_last", 5: "torch.channels_last_3d"}.get(len(ym.shape))
        y_cl, x_cl = ym.channels_last and not ym.contiguous, xm.channels_last and not xm.contiguous
        args = ["x", "w"] + (["b"] if isinstance(b, Ref) else [])
        text = triton_template("conv_transpose_forward.py.j2").render(
            node=node.name, args=args, bias="b" if isinstance(b, Ref) else "None", groups=int(groups),
            cin=int(wm.shape[0]), cout_g=int(wm.shape[1]), kernel=k, flip=list(range(2, 2 + nd)),
            padding=pad, dilation=_ints(dilation, nd), ones=[1] * nd, zeros=[0] * nd,
            w_format=fmt if x_cl else "torch.contiguous_format", y_format=fmt if y_cl else "torch.contiguous_format",
            input_shape=list(xm.shape), weight_shape=list(wm.shape), out_shape=list(ym.shape))
        return NodeKernel(text, [x.name, w.name] + ([b.name] if isinstance(b, Ref) else []), 1)


TEMPLATE = ConvTransposeForwardTemplate()
