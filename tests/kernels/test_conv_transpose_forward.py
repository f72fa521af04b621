"""The stride-1 transposed convolution run as cuDNN's (here: ATen's) forward convolution with the
flipped, channel-swapped kernel (codegen/conv_transpose_forward.py) against the transposed call."""
from __future__ import annotations

import pytest
import torch

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture.graph import Graph, Input, OpNode, Ref, TensorMeta
from kernelwright.codegen.conv_transpose_forward import TEMPLATE
from kernelwright.codegen.node_kernels import template_for

CONV = "aten.convolution.default"


def _graph(x, w, b, padding, dilation, groups, out, stride=1, output_padding=0):
    nd = x.dim() - 2
    meta = lambda t: TensorMeta(tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""))  # noqa: E731
    inputs = [Input("x", "user", meta(x), index=0), Input("w", "param", meta(w), fqn="w")]
    if b is not None:
        inputs.append(Input("b", "param", meta(b), fqn="b"))
    node = OpNode("conv", CONV, (Ref("x"), Ref("w"), Ref("b") if b is not None else None, [stride] * nd,
                                 [padding] * nd, [dilation] * nd, True, [output_padding] * nd, groups), {}, [meta(out)])
    return Graph("hand", inputs, [node], ["conv"]), node


@pytest.mark.parametrize("nd,groups,padding,dilation,bias,cl", [
    (1, 1, 0, 1, True, False),
    (2, 1, 1, 1, False, False),
    (2, 2, 2, 2, True, True),
    (3, 1, 1, 1, True, True),
    (3, 4, 0, 1, False, False),
])
def test_forward_form_matches_the_transposed_convolution(nd, groups, padding, dilation, bias, cl, tmp_path):
    torch.manual_seed(0)
    cin, cout_g, k = 8, 3, 3
    x = torch.randn(2, cin, *[5, 6, 4][:nd], dtype=torch.float64)
    w = torch.randn(cin, cout_g, *[k] * nd, dtype=torch.float64)
    b = torch.randn(cout_g * groups, dtype=torch.float64) if bias else None
    if cl:
        fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    ref = torch.ops.aten.convolution.default(x, w, b, [1] * nd, [padding] * nd, [dilation] * nd, True, [0] * nd, groups)
    if cl:
        ref = ref.contiguous(memory_format=fmt)
    graph, node = _graph(x, w, b, padding, dilation, groups, ref)
    assert TEMPLATE.supports(graph, node, {0}) is None
    assert template_for(graph, node)[0] is TEMPLATE
    kernel = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
    mod = load_module_from_source(kernel.source, f"ctf_{nd}_{groups}_{cl}", tmp_path)
    (y,) = mod.launch(*[{"x": x, "w": w, "b": b}[v] for v in kernel.inputs])
    assert y.stride() == ref.stride()  # the layout the plan gave the node
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


def test_refuses_what_one_forward_convolution_cannot_compute():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3)
    for kw, why in ((dict(stride=2), "stride"), (dict(padding=3), "padding"),
                    (dict(stride=2, output_padding=1), "stride")):
        out = torch.ops.aten.convolution.default(x, w, None, [kw.get("stride", 1)] * 2, [kw.get("padding", 0)] * 2,
                                                 [1, 1], True, [kw.get("output_padding", 0)] * 2, 1)
        graph, node = _graph(x, w, None, kw.get("padding", 0), 1, 1, out, kw.get("stride", 1),
                             kw.get("output_padding", 0))
        reason = TEMPLATE.supports(graph, node, {0})
        assert reason and why in reason
        with pytest.raises(ValueError):
            TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
    graph, node = _graph(x, w, None, 1, 1, 1, torch.empty(1, 2, 5, 5))
    forward = OpNode("conv", CONV, node.args[:6] + (False,) + node.args[7:], {}, node.outs)
    assert "not a transposed" in TEMPLATE.supports(graph, forward, {0})
