"""Transposed convolutions run as cuDNN's (here: ATen's) forward convolution
(codegen/conv_transpose_forward.py) against the transposed call: stride 1 with the flipped,
channel-swapped kernel; strided ones as one convolution over the output's phases."""
from __future__ import annotations

import math

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
    for kw, why in ((dict(padding=3), "padding"),
                    (dict(stride=2, dilation=2), "dilated"), (dict(dilation=2, output_padding=1), "output_padding")):
        out = torch.ops.aten.convolution.default(x, w, None, [kw.get("stride", 1)] * 2, [kw.get("padding", 0)] * 2,
                                                 [kw.get("dilation", 1)] * 2, True, [kw.get("output_padding", 0)] * 2, 1)
        graph, node = _graph(x, w, None, kw.get("padding", 0), kw.get("dilation", 1), 1, out, kw.get("stride", 1),
                             kw.get("output_padding", 0))
        reason = TEMPLATE.supports(graph, node, {0})
        assert reason and why in reason
        with pytest.raises(ValueError):
            TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
    graph, node = _graph(x, w, None, 1, 1, 1, torch.empty(1, 2, 5, 5))
    forward = OpNode("conv", CONV, node.args[:6] + (False,) + node.args[7:], {}, node.outs)
    assert "not a transposed" in TEMPLATE.supports(graph, forward, {0})


@pytest.mark.parametrize("nd,k,stride,padding,output_padding,groups,cl", [
    (2, 3, 2, 1, 1, 1, False),  # the common decoder layer: output 2x the input, 16/9 the products
    (2, 4, 2, 1, 0, 2, True),
    (2, 3, 2, 1, 0, 1, True),  # output 2 I - 1: the last phase row cropped
    (1, 5, 3, 3, 2, 1, False),
    (3, 3, 2, 1, 1, 1, True),
    (3, 2, (2, 1, 2), 0, 0, 3, False),
    (2, 3, 2, 2, 1, 1, False),  # padding beyond half the kernel
    (2, 3, 3, 1, 2, 2, True),  # stride 3, padding 1: phases only
    (2, 2, 3, 0, 0, 1, False),  # a kernel smaller than the stride: phases with no taps (the bias)
])
def test_strided_forms_match_the_strided_transposed_convolution(nd, k, stride, padding, output_padding, groups,
                                                                   cl, tmp_path):
    torch.manual_seed(0)
    cin, cout_g = 6, 2
    s = [stride] * nd if isinstance(stride, int) else list(stride)
    x = torch.randn(2, cin, *[5, 6, 4][:nd], dtype=torch.float64)
    w = torch.randn(cin, cout_g, *[k] * nd, dtype=torch.float64)
    b = torch.randn(cout_g * groups, dtype=torch.float64)
    if cl:
        fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    op = [output_padding] * nd if output_padding < min(s) else [0] * nd
    ref = torch.ops.aten.convolution.default(x, w, b, s, [padding] * nd, [1] * nd, True, op, groups)
    if cl:
        ref = ref.contiguous(memory_format=fmt)
    graph, node = _graph(x, w, b, padding, 1, groups, ref, stride=1, output_padding=0)
    node.args = node.args[:3] + (s,) + node.args[4:7] + (op,) + node.args[8:]
    assert TEMPLATE.supports(graph, node, {0}) is None
    forms = [c["form"] for c in TEMPLATE.space(graph, node)]
    assert sorted(forms) == (["phases", "subpixel"] if max(s) <= 2 or padding % max(s) == 0 else ["phases"])
    waste = math.prod(-(-k // sa) * sa / k for sa in s)  # the subpixel form's products over the transposed one's
    assert forms[0] == ("subpixel" if waste <= 1.5 and len(forms) == 2 else "phases")
    for config in TEMPLATE.space(graph, node):
        kernel = TEMPLATE.render(graph, node, config, {0})
        mod = load_module_from_source(kernel.source, f"ct_{config['form']}_{nd}_{k}_{padding}_{groups}_{cl}", tmp_path)
        (y,) = mod.launch(x, w, b)
        assert y.shape == ref.shape and y.stride() == ref.stride()
        torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
