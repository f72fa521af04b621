"""The score-attention node template: hand-written attention whose scores go through elementwise
ops (ReLU attention) as one kernel anchored at the second bmm, in the interpreter."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.codegen.triton_score_attention import NAME, TEMPLATE, match
from kernelwright.emit.module import import_model_new
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module, load_problem

pytestmark = pytest.mark.interpreter

RELU_ATTENTION = Path(__file__).resolve().parents[1] / "fixtures" / "sweep" / "relu_attention.py"


class Scored(nn.Module):
    """3-D attention (one head per batch row) with a sigmoid of the scaled scores plus a bias."""

    def forward(self, q, k, v, bias):
        return torch.bmm(torch.sigmoid(torch.bmm(q, k.transpose(1, 2)) * 0.3 + bias), v)


def _bmms(graph):
    return [n for n in graph.nodes if n.target == "aten.bmm.default"]


def test_a_sigmoid_score_chain_matches_torch_across_configs(tmp_path):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 9, 24, generator=g), torch.randn(3, 13, 24, generator=g), torch.randn(3, 13, 16, generator=g)
    bias = torch.randn(9, 13, generator=g)
    graph, _ = rewrite(capture(from_module(Scored(), [q, k, v, bias])), "fp32")
    first, second = _bmms(graph)
    assert match(graph, first) is None and template_for(graph, second)[0].name == NAME
    m = match(graph, second)
    assert m.k.nodes == () and [graph.node(n).op for n in m.chain] == ["mul", "add", "sigmoid"]
    want = Scored()(q, k, v, bias)
    space = TEMPLATE.space(graph, second, policy="fp32")
    for i, cfg in enumerate(dict.fromkeys([TEMPLATE.default(graph, second, policy="fp32"), space[0], space[-1]])):
        src = TEMPLATE.render(graph, second, cfg.as_dict(), used_outputs(graph, second)).source
        reads = TEMPLATE.absorbed(graph, second)[1]  # q, kᵀ (a transposed view of k), v, bias
        assert reads[0] == "q" and reads[2:] == ["v", "bias"] and graph.node(reads[1]).op in ("permute", "transpose")
        mod = load_module_from_source(src, f"scored_{i}", tmp_path)
        (out,) = mod.launch(q, k.transpose(1, 2), v, bias)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["tf32", "bf16"])
def test_the_plan_runs_relu_attention_as_one_kernel_with_the_heads_merged(policy, tmp_path):
    """The fixture's copies of q, kᵀ, v, both bmms, the masked ReLU and the merge of the heads are
    one unit (under bf16 with the scores' cast to bf16, without the merge); the emitted forward
    launches it on the projection's views and matches Model."""
    problem = load_problem(RELU_ATTENTION)
    result = optimize_problem(problem, tmp_path / "out", Options(device="cpu", budget_trials=1, precision=policy,
                                                                 db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    rows = {g["id"]: g for g in result["groups"]}
    fused = [g for g in rows.values() if g["ops"].count("bmm") == 2]
    # (under bf16 the result's cast back to float32 sits between the bmm and the merge of the heads)
    assert len(fused) == 1 and fused[0]["ops"][-1] == ("clone" if policy == "tf32" else "bmm"), rows
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert "torch.bmm" not in text
    ref = problem.make_model()
    new = import_model_new(tmp_path / "out" / "model_new.py").ModelNew(*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(3)[0]
    with torch.no_grad():
        tol = 1e-5 if policy == "tf32" else 3e-2  # (the interpreter's dots are float32; bf16 operands)
        torch.testing.assert_close(new(x).float(), ref(x), rtol=tol, atol=tol)


def test_what_the_template_leaves_alone():
    class Softmax(nn.Module):
        def forward(self, q, k, v):
            return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)), -1), v)

    class ScoresTwice(nn.Module):  # the scores read by two ops: the kernel would not write them
        def forward(self, q, k, v):
            s = torch.bmm(q, k.transpose(1, 2))
            return torch.bmm(torch.relu(s) * s, v)

    class Returned(nn.Module):  # the scores returned too
        def forward(self, q, k, v):
            s = torch.relu(torch.bmm(q, k.transpose(1, 2)))
            return torch.bmm(s, v), s

    x = torch.randn(2, 8, 16)
    for model in (Softmax(), ScoresTwice(), Returned()):
        graph, _ = rewrite(capture(from_module(model, [x, x.clone(), x.clone()])), "tf32")
        graph = plan_graph(graph).graph
        assert all(match(graph, n) is None for n in _bmms(graph)), type(model).__name__


def test_blocks_the_chain_maps_to_zeros_skip_v_exactly(tmp_path):
    """32-query x 16-key tiles over the fixture's 40 positions: the causal mask and the ReLU zero
    the last key block of the first query block, whose v tile and product the kernel skips."""
    problem = load_problem(RELU_ATTENTION)
    graph = plan_graph(rewrite(capture(problem), "tf32")[0]).graph
    anchor = next(n for n in _bmms(graph) if match(graph, n) is not None)
    _, reads, result = TEMPLATE.absorbed(graph, anchor)
    with torch.no_grad():
        env = run_graph(graph, problem.make_model(), problem.make_inputs(1), keep=set(reads) | {result},
                        planned_layouts=True)
    cfg = TEMPLATE.default(graph, anchor, policy="tf32").replace(BLOCK_M=32, BLOCK_N=16)
    assert cfg in TEMPLATE.space(graph, anchor, policy="tf32")
    src = TEMPLATE.render(graph, anchor, cfg.as_dict(), used_outputs(graph, anchor)).source
    assert "if tl.max(tl.where(p == 0.0, 0, 1)) > 0:" in src
    (out,) = load_module_from_source(src, "relu_skip", tmp_path).launch(*[env[r] for r in reads])
    torch.testing.assert_close(out, env[result], rtol=1e-5, atol=1e-5)
