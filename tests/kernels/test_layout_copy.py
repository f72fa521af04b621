"""The layout-copy node template: NCHW <-> channels-last copies as a tiled Triton transpose."""
from __future__ import annotations


import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.shapes import channels_last_strides
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


class ToLayout(nn.Module):
    """x -> channels-last copy (-> * 1.5 -> back to contiguous when `back`)."""

    def __init__(self, fmt, back):
        super().__init__()
        self.fmt, self.back = fmt, back

    def forward(self, x):
        y = x.clone(memory_format=self.fmt) * 1.5
        return y.clone(memory_format=torch.contiguous_format) if self.back else y


@pytest.mark.parametrize("shape,fmt,back", [((2, 5, 7, 3), torch.channels_last, False),
                                            ((2, 5, 7, 3), torch.channels_last, True),
                                            ((1, 3, 4, 5, 6), torch.channels_last_3d, False)])
def test_layout_copy_matches_torch_and_writes_the_target_layout(shape, fmt, back, tmp_path):
    graph = capture(from_module(ToLayout(fmt, back), [torch.randn(shape)]))
    node = [n for n in graph.nodes if n.target == "aten.clone.default"][-1]
    src = graph.meta(node.args[0].name)
    x = torch.empty_strided(src.shape, src.stride).copy_(torch.randn(shape))
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.layout_copy", why
    space = template.space(graph, node)
    assert template.default(graph, node) in space
    for cfg in (template.default(graph, node), space[0], space[-1]):
        k = template.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
        mod = load_module_from_source(k.source, f"layout_{len(shape)}_{back}", tmp_path)
        (y,) = mod.launch(x)
        assert torch.equal(y, x) and y.stride() == node.meta.stride


def test_the_tf32_rewrite_inserts_copies_this_template_takes():
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    graph, _ = rewrite(capture(from_module(conv, [torch.randn(1, 3, 8, 8)])), "tf32")
    copies = [n for n in graph.nodes if n.target == "aten.clone.default"]
    assert copies and all(n.meta.stride == channels_last_strides(n.meta.shape) for n in copies)
    assert all(template_for(graph, n)[0].name == "triton.layout_copy" for n in copies)


def test_a_bf16_cast_and_layout_change_run_as_one_copy(tmp_path):
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    graph, _ = rewrite(capture(from_module(conv, [x])), "bf16")
    copies = [n for n in graph.nodes if n.target == "aten._to_copy.default" and "memory_format" in n.kwargs]
    assert len(copies) == 2
    node = next(n for n in copies if n.args[0].name == graph.inputs[-1].name or graph.meta(n.args[0].name).shape == x.shape)
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.layout_copy", why
    k = template.render(graph, node, template.default(graph, node).as_dict(), used_outputs(graph, node))
    (y,) = load_module_from_source(k.source, "layout_cast", tmp_path).launch(x)
    assert y.dtype == torch.bfloat16 and y.stride() == channels_last_strides(y.shape)
    want = x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    # rounded once to nearest even, like torch, compiled or interpreted (the interpreter's own cast
    # truncates: kw_cast_out rounds there)
    assert torch.equal(y, want)
