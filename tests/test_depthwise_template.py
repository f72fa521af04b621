"""The depthwise conv node template: chosen for depthwise convs only, and equal to cuDNN's result."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from kernelwright.build.pyload import load_module_from_source  # noqa: E402
from kernelwright.capture import capture  # noqa: E402
from kernelwright.codegen.node_kernels import template_for, used_outputs  # noqa: E402
from kernelwright.problem import from_module  # noqa: E402

pytestmark = pytest.mark.interpreter


def _conv_node(conv, x):
    graph = capture(from_module(conv, [x]))
    return graph, next(n for n in graph.nodes if n.target == "aten.convolution.default")


@pytest.mark.parametrize("mult,stride,dilation,bias", [(1, 1, 1, True), (2, 2, 1, False), (1, 1, 2, True)])
def test_depthwise_template_matches_cudnn(mult, stride, dilation, bias, tmp_path):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4 * mult, 3, stride=stride, padding=1, dilation=dilation, groups=4, bias=bias)
    x = torch.randn(2, 4, 9, 7)
    graph, node = _conv_node(conv, x)
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.depthwise", why
    configs = template.space(graph, node)
    assert configs and len(set(configs)) == len(configs)
    for cfg in (template.default(graph, node), configs[-1]):
        k = template.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
        mod = load_module_from_source(k.source, f"dw_{mult}_{stride}_{dilation}", tmp_path)
        args = [x, conv.weight.detach()] + ([conv.bias.detach()] if bias else [])
        assert len(k.inputs) == len(args)
        (y,) = mod.launch(*args)
        torch.testing.assert_close(y, conv(x).detach(), rtol=1e-5, atol=1e-5)


def test_a_dense_conv_is_not_depthwise():
    graph, node = _conv_node(nn.Conv2d(4, 8, 3), torch.randn(1, 4, 6, 6))
    template, _ = template_for(graph, node)
    assert template is None or template.name != "triton.depthwise"
