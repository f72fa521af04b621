"""Exact rewrites: no-op removal keeps values, never touches outputs."""
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan.rewrites import simplify
from kernelwright.problem import from_module


class NoOps(nn.Module):
    def forward(self, x):
        y = x.clone() * 1
        z = (y.to(torch.float32) + 0).expand(4, 6)
        return torch.relu(z / 1) - 0, x.clone()


def test_noops_are_removed_and_values_kept():
    x = torch.randn(4, 6)
    g = capture(from_module(NoOps(), [x]))
    s, removed = simplify(g)
    assert len(s.nodes) < len(g.nodes) and removed
    assert all("returns its input" in line for line in removed)
    assert {n.target for n in s.nodes} >= {"aten.relu.default"}
    assert not any(n.target == "aten.mul.Tensor" for n in s.nodes)
    ref = run_graph(g, NoOps(), [x])
    out = run_graph(s, NoOps(), [x])
    for a, b in zip(out, ref):
        assert torch.equal(a, b)
    # the returned clone stays: returning the input itself would alias it
    last = s.outputs[-1]
    assert s.node(last).target == "aten.clone.default"


def test_a_graph_without_noops_is_returned_as_is():
    g = capture(from_module(nn.ReLU(), [torch.randn(3)]))
    s, removed = simplify(g)
    assert s is g and removed == []
