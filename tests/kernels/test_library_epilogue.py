"""The cuBLASLt bias + activation candidate (codegen/library_epilogue.py): which epilogue chains
it takes, and that its module computes them (on the CPU, where torch runs _addmm_activation as
addmm + activation)."""
import os
import textwrap

import pytest
import torch

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen import gemm_epilogue, library_epilogue
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import load_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _chains(path, policy):
    """(plan graph, [(gemm node, group, match result)]) for each GEMM feeding a group."""
    problem = load_problem(path, small=True)
    plan = plan_graph(rewrite(capture(problem), policy)[0])
    g, found = plan.graph, []
    for group in plan.groups:
        for v in group.inputs:
            if not g.is_input(v) and g.node(v).target in gemm_epilogue.GEMMS:
                gemm = g.node(v)
                found.append((gemm, group, library_epilogue.match(g, gemm, group.nodes, group.outputs,
                                                                  g.meta(gemm.name).shape[1])))
    return problem, plan, found


@pytest.mark.parametrize("name, policy, ops", [
    ("level2/gemm_bias_relu.py", "fp32", ("add bias", "relu")),
    ("level2/gemm_bias_relu.py", "bf16", ("widen", "add bias", "relu")),
    ("level3/mlp.py", "bf16", ("widen", "add bias", "relu", "cast bfloat16")),
])
def test_bias_relu_chains_match(name, policy, ops):
    _, plan, found = _chains(os.path.join(ROOT, "problems", name), policy)
    chains = [c for _, _, c in found if not isinstance(c, str)]
    assert chains and all(c.ops == ops for c in chains)
    assert all(plan.graph.meta(c.bias).shape == (plan.graph.meta(c.bias).shape[0],) for c in chains)


@pytest.mark.parametrize("name", ["level2/gemm_gelu_scale.py", "level2/gemm_softmax.py", "level2/gemm_sigmoid_sum.py"])
def test_other_epilogues_do_not_match(name):
    """Exact GELU (cuBLASLt has only the tanh form), a scale after the activation, or no
    activation: the chain is not bias + activation, and the reason says so."""
    _, _, found = _chains(os.path.join(ROOT, "problems", name), "fp32")
    assert found and all(isinstance(c, str) for _, _, c in found)


MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 40)

    def forward(self, x):
        return {activation}(self.fc(x))


def get_inputs():
    return [torch.randn(24, 48)]


def get_init_inputs():
    return []


SMALL = {{}}
"""


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_module_computes_bias_relu(tmp_path, policy):
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(MODEL.format(activation="F.relu")))
    problem, plan, found = _chains(str(path), policy)
    ((gemm, group, chain),) = found
    assert not isinstance(chain, str)
    fused = gemm_epilogue.build(plan.graph, gemm, group, plan.groups)
    text, ins = library_epilogue.render(plan.graph, gemm, chain, fused.a, fused.b, "g_test")
    assert "torch._addmm_activation(" in text
    assert ins[-1] == chain.bias and ins[0] == "x"  # the float32 activation, cast in launch under bf16
    assert ("a0 = a0.to(torch.bfloat16)" in text) == (policy == "bf16")
    mod = load_module_from_source(text, "g_test", tmp_path / ".build")
    model = problem.make_model()
    (x,) = problem.make_inputs(1)
    values = {"x": x, chain.bias: model.fc.bias.detach(), fused.b: model.fc.weight.detach().t()}
    if policy == "bf16":
        values[fused.b] = values[fused.b].to(torch.bfloat16)  # the program's cached weight copy
    (out,) = mod.launch(*[values[v] for v in ins])
    ref = model.double()(x.double())
    assert out.dtype == torch.float32 and out.shape == ref.shape and (out >= 0).all()
    tol = 1e-5 if policy == "fp32" else 3e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("activation", ['lambda v: F.gelu(v, approximate="tanh")', "F.gelu", "torch.sigmoid"])
def test_other_activations_are_not_taken(tmp_path, activation):
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(MODEL.format(activation=f"({activation})")))
    _, _, ((_, _, chain),) = _chains(str(path), "fp32")
    assert isinstance(chain, str) and "ReLU" in chain
