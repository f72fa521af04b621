"""Cheap elementwise values recomputed by the kernel reading them (plan/recompute.py) instead of
stored by a reduction kernel: the shape of a decomposed batch norm backward, planned, rendered and
run in the Triton interpreter against the graph as captured; and the values left stored."""
import os

import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen.triton_group import render_group
from kernelwright.plan import plan_graph
from kernelwright.plan.recompute import recompute_reads
from kernelwright.plan.rewrites import fold_scalar_tensors
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _per_channel(v):
    return v.unsqueeze(0).unsqueeze(2).unsqueeze(3)  # as AOTAutograd's batch norm backward broadcasts


class BatchNormBackward(nn.Module):
    """where(y <= 0, 0, grad) and x - mean feed two sums per channel and the gradient after them,
    which reads the per-channel values through unsqueezes (a kernel of its own). `returns`: also
    return x - mean (then it stays stored); `wide`: the gradient reads x - mean - z1 - z2 of three
    domain-sized operands the reader does not load (too many bytes to compute again)."""

    def __init__(self, returns: bool = False, wide: bool = False):
        super().__init__()
        self.returns, self.wide = returns, wide
        self.weight = nn.Parameter(torch.randn(8))

    def forward(self, grad, y, x, mean, invstd, z1, z2):
        w = torch.where(y <= 0, 0.0, grad)
        c = x - mean.view(1, 8, 1, 1)
        if self.wide:
            c = c - z1 * z2 + z1.exp()
        s1, s2 = w.sum((0, 2, 3)), (w * c).sum((0, 2, 3))
        a, b = _per_channel(s2 * 0.1 * invstd * invstd), _per_channel(s1 * 0.1)
        out = (w - c * a - b) * _per_channel(invstd * self.weight)
        return (out, s1, s2, c) if self.returns else (out, s1, s2)


def _inputs():
    torch.manual_seed(0)
    d = (2, 8, 3, 5)
    return [torch.randn(d), torch.randn(d), torch.randn(d), torch.randn(8), torch.rand(8) + 0.5,
            torch.randn(d), torch.randn(d)]


def _captured(model, inputs):
    return fold_scalar_tensors(capture(from_module(model, inputs)))[0]  # where(c, 0.0, x) reads no tensor for 0.0


def _reduction(plan):
    (red,) = [g for g in plan.groups if g.rdims is not None]
    return red


def test_the_reader_computes_the_values_again_and_the_reduction_stores_rows_only():
    model, inputs = BatchNormBackward(), _inputs()
    graph = _captured(model, inputs)
    before = _reduction(plan_graph(graph))
    assert {graph.node(v).op for v in before.outputs if graph.meta(v).shape == before.domain} == {"where", "sub"}
    rewritten, notes = recompute_reads(graph)
    assert len(notes) == 2 and notes[0].startswith("where (le, where)")
    plan = plan_graph(rewritten)
    red = _reduction(plan)
    assert all(rewritten.meta(v).shape != red.domain for v in red.outputs)  # per-channel values only
    (reader,) = [g for g in plan.groups if g.rdims is None and g.domain == red.domain]
    assert {rewritten.node(n).op for n in reader.nodes} >= {"le", "where", "sub"}
    assert not set(reader.inputs) & set(red.nodes[:2])  # it reads grad, y, x, mean: not where
    env = run_graph(rewritten, model, inputs, keep=True)
    for got, want in zip([env[o] for o in rewritten.outputs], model(*inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for grp in plan.groups:  # every kernel of the rewritten plan against the library's values
        for cfg in ({"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4},
                    {"BLOCK_M": 64, "BLOCK_R": 1, "one_pass": False, "num_warps": 4}):
            if (grp.rdims is None) != (cfg["BLOCK_R"] == 1):
                continue
            k = render_group(rewritten, grp, cfg)
            mod = load_module_from_source(k.source, grp.id + "_re", os.path.join(ROOT, ".pytest_kw_cache"))
            outs = mod.launch(*[env[v] for v in k.inputs])
            for name, out in zip(k.outputs, outs if isinstance(outs, (tuple, list)) else [outs]):
                torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["returned", "too wide"])
def test_values_stay_stored_when_returned_or_dearer_to_compute_than_to_read(kind):
    model = BatchNormBackward(returns=kind == "returned", wide=kind == "too wide")
    graph = _captured(model, _inputs())
    rewritten, notes = recompute_reads(graph)
    kept = [n for n in notes if n.startswith("sub") or n.startswith("add")]
    assert not kept  # x - mean (and the wide value) stay the reduction's output
    assert any(n.startswith("where") for n in notes)  # the mask's where is still cheap
    red = _reduction(plan_graph(rewritten))
    assert any(rewritten.meta(v).shape == red.domain for v in red.outputs)
