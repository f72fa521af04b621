"""A training batch norm whose result goes on into a pool, split into its statistics and a
pointwise apply (plan/batch_norm.py): the rewritten graph computes the output and the running
statistics eager computes (float64), the planner keeps the apply apart from the statistics so the
pool chain can take it, and batch norms that feed anything else stay one normalization group."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module


class ConvBnPool(nn.Module):
    def __init__(self, bias=True, affine=True, then="pool", nd=2):
        super().__init__()
        self.conv = (nn.Conv2d if nd == 2 else nn.Conv3d)(3, 5, 3, padding=1, bias=bias)
        self.bn = (nn.BatchNorm2d if nd == 2 else nn.BatchNorm3d)(5, affine=affine, momentum=0.3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            if affine:
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-0.5, 0.5)
        self.then, self.nd = then, nd

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if self.then == "pool":
            return (F.max_pool2d if self.nd == 2 else F.max_pool3d)(y, 2)
        return y.sum(dim=1)


def _rewritten(model, x, policy="fp32"):
    graph, notes = rewrite(capture(from_module(model, [x])), policy)
    return graph, notes


@pytest.mark.parametrize("bias,affine,nd", [(True, True, 2), (False, True, 2), (True, False, 3), (False, False, 2)])
def test_the_split_computes_the_output_and_the_running_statistics(bias, affine, nd):
    torch.manual_seed(0)
    model = ConvBnPool(bias, affine, nd=nd).double().train()
    x = torch.randn(2, 3, *([6, 7] if nd == 2 else [4, 5, 4]), dtype=torch.float64)
    graph, notes = _rewritten(model.float(), x.float())
    assert any("statistics and a pointwise apply" in n for n in notes)
    assert not any(n.target == "aten._native_batch_norm_legit_functional.default" for n in graph.nodes)
    assert (bias and "the statistics read" in " ".join(notes)) or not bias
    model = model.double()
    reference = ConvBnPool(bias, affine, nd=nd).double().train()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
        want = reference(x)
    torch.testing.assert_close(env[graph.outputs[0]], want, rtol=1e-10, atol=1e-10)
    for node, fqn in graph.mutations.items():  # the running statistics (and the batch counter)
        torch.testing.assert_close(env[node].to(torch.float64), dict(reference.named_buffers())[fqn].to(torch.float64),
                                   rtol=1e-10, atol=1e-10)


def test_the_apply_is_the_pool_chains_prologue():
    torch.manual_seed(0)
    graph, _ = _rewritten(ConvBnPool().train(), torch.randn(2, 3, 6, 7))
    plan = plan_graph(graph)
    (chain,) = plan.chains
    assert chain.pre is not None and any(n.endswith("_centred") for n in chain.pre.nodes)
    stats = [g for g in plan.groups if g.kind == "reduction"]
    assert len(stats) == 1  # one kernel reads the convolution for the mean and the variance
    assert {"getitem_3", "getitem_4"} <= set(stats[0].nodes)  # the running statistics in it too


def test_a_batch_norm_that_feeds_no_pool_stays_one_group():
    graph, notes = _rewritten(ConvBnPool(then="sum").train(), torch.randn(2, 3, 6, 7))
    assert not any("pointwise apply" in n for n in notes)
    assert any(n.target == "aten._native_batch_norm_legit_functional.default" for n in graph.nodes)
