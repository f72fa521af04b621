"""The attention node template: scaled_dot_product_attention as one Triton kernel with the online
softmax, against PyTorch's SDPA in the interpreter."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen.node_kernels import seeds, template_for, used_outputs
from kernelwright.codegen.triton_attention import NAME, SDPA, TEMPLATE
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


class Sdpa(nn.Module):
    def __init__(self, how: str, scale=None):
        super().__init__()
        self.how, self.scale = how, scale

    def forward(self, q, k=None, v=None, mask=None):
        if self.how == "heads":  # q, k, v split from one projection by views, read in place
            b, s, _ = q.shape
            q, k, v = (t.view(b, s, 2, -1).transpose(1, 2) for t in q.split(q.shape[-1] // 3, dim=2))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.how == "causal", scale=self.scale)


def _node(model, inputs):
    graph = capture(from_module(model, inputs))
    node = next(n for n in graph.nodes if n.target == SDPA)
    return graph, node


def _run(graph, node, cfg, inputs, tmp_path, tag):
    k = TEMPLATE.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
    mod = load_module_from_source(k.source, f"attn_{tag}", tmp_path)
    (out,) = mod.launch(*inputs)
    assert out.stride() == node.meta.stride
    return out, k.source


CASES = {
    # name: (how, q, k, v shapes, mask shape or None, scale)
    "plain": ("plain", (2, 3, 9, 24), (2, 3, 13, 24), (2, 3, 13, 16), None, None),
    "causal": ("causal", (1, 2, 21, 16), (1, 2, 21, 16), (1, 2, 21, 32), None, 0.3),
    "mask": ("plain", (2, 2, 7, 8), (2, 2, 11, 8), (2, 2, 11, 8), (1, 2, 7, 11), None),
    "three_d": ("plain", (3, 10, 20), (3, 6, 20), (3, 6, 20), None, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_matches_sdpa_across_configs(case, tmp_path):
    how, qs, ks, vs, ms, scale = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    inputs = [torch.randn(s, generator=g) for s in (qs, ks, vs)]
    if ms is not None:
        mask = torch.rand(ms, generator=g) > 0.3
        mask[..., 0] = True  # (no row masked entirely)
        inputs.append(mask)
    graph, node = _node(Sdpa(how, scale), inputs)
    template, why = template_for(graph, node)
    assert template is TEMPLATE, why
    want = F.scaled_dot_product_attention(*inputs[:3], attn_mask=inputs[3] if ms else None,
                                          is_causal=how == "causal", scale=scale)
    space = TEMPLATE.space(graph, node, policy="fp32")
    picks = [TEMPLATE.default(graph, node, policy="fp32"), space[0], space[-1]]
    assert all(c in space for c in seeds(TEMPLATE, graph, node, policy="fp32"))
    for i, cfg in enumerate(dict.fromkeys(picks)):
        out, _ = _run(graph, node, cfg, inputs, tmp_path, f"{case}_{i}")
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("band", [None, 5])
def test_blocks_a_mask_leaves_out_are_skipped_exactly(band, tmp_path):
    # a lower-triangular mask (band None) and a sliding window of 5 keys: with 16 x 16 tiles over
    # 40 keys some key blocks hold no kept key for a whole query block
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    mask = (j <= i) & ((i - j < band) if band else True)
    graph, node = _node(Sdpa("plain"), [q, k, v, mask])
    cfg = TEMPLATE.default(graph, node, policy="fp32").replace(BLOCK_M=32, BLOCK_N=16)
    out, source = _run(graph, node, cfg, [q, k, v, mask], tmp_path, f"band{band}")
    assert "if tl.max(keep.to(tl.int32)) > 0:" in source
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-5, atol=1e-5)


def test_by_hand_attention_under_tf32_reads_the_heads_in_place(tmp_path):
    x = torch.randn(2, 10, 48)
    graph, node = _node(Sdpa("heads"), [x])
    q = graph.meta(node.args[0].name)
    assert q.stride[-2] == 48  # a view of the projection, no copy
    cfg = TEMPLATE.default(graph, node, policy="tf32")
    assert cfg["DOT"] == "tf32"
    qh, kh, vh = (t.view(2, 10, 2, -1).transpose(1, 2) for t in x.split(16, dim=2))
    out, source = _run(graph, node, cfg, [qh, kh, vh], tmp_path, "heads")
    assert 'input_precision="tf32"' in source
    # (the interpreter multiplies in float32 whatever the input precision)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(qh, kh, vh, is_causal=True), rtol=1e-5, atol=1e-5)


def test_bf16_operands_round_the_probabilities_once(tmp_path):
    q, k, v = (torch.randn(1, 2, 16, 32).to(torch.bfloat16) for _ in range(3))
    graph, node = _node(Sdpa("causal"), [q, k, v])
    out, source = _run(graph, node, TEMPLATE.default(graph, node, policy="bf16"), [q, k, v], tmp_path, "bf16")
    assert out.dtype == torch.bfloat16 and "input_precision" not in source
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert (out.double() - want).abs().max() < 3e-2


def test_what_the_template_leaves_to_the_library():
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cases = [(Sdpa("plain"), [q, k, k, torch.randn(5, 5)], "not boolean"),  # an additive mask
             (Sdpa("plain"), [q, torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)], "grouped-query"),
             (Sdpa("plain"), [torch.randn(1, 2, 5, 300), torch.randn(1, 2, 5, 300), k], "head size")]
    for model, inputs, why in cases:
        graph, node = _node(model, inputs)
        reason = TEMPLATE.supports(graph, node, used_outputs(graph, node))
        assert reason is not None and why in reason, reason


def test_the_plan_gives_a_rewritten_attention_this_template():
    class ByHand(nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v

    q = torch.randn(2, 2, 8, 16)
    graph, _ = rewrite(capture(from_module(ByHand(), [q, q.clone(), q.clone()])), "fp32")
    plan = plan_graph(graph)
    sdpa = [plan.graph.node(u.node) for u in plan.units if u.group is None and plan.graph.node(u.node).target == SDPA]
    assert len(sdpa) == 1 and template_for(plan.graph, sdpa[0])[0].name == NAME


def test_offsets_past_two_to_the_31_take_64_bit_indices(tmp_path, monkeypatch):
    from kernelwright.capture.graph import TensorMeta

    monkeypatch.setattr(TensorMeta, "span", 2**31)  # (as for a tensor that large)
    q, k, v = (torch.randn(1, 2, 20, 16) for _ in range(3))
    graph, node = _node(Sdpa("causal"), [q, k, v])
    out, source = _run(graph, node, TEMPLATE.default(graph, node, policy="fp32"), [q, k, v], tmp_path, "wide")
    assert source.count(".to(tl.int64)") == 3
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-5)
