"""Decomposed activations put back together (plan/recompose.py) and computed by the op table."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan.recompose import recompose_mish
from kernelwright.plan.rewrites import rewrite, simplify
from kernelwright.problem import from_module


class TwoMish(nn.Module):
    """KernelBench level-2 #4's epilogue: F.mish twice, and a hand-written mish beside it."""

    def forward(self, x):
        y = F.mish(F.mish(x + 1.0))
        return y, x * torch.tanh(F.softplus(x)) - 1.0


class NotMish(nn.Module):
    """Softplus at another threshold, or of another value than the factor: no mish."""

    def forward(self, x, z):
        return x * torch.tanh(F.softplus(x, threshold=10.0)), z * torch.tanh(F.softplus(x))


class MishKept(nn.Module):
    """The softplus is returned too: it stays, the mish still becomes one op."""

    def forward(self, x):
        s = F.softplus(x)
        return x * torch.tanh(s), s


def _targets(g):
    return [n.target for n in g.nodes]


def test_every_decomposed_mish_becomes_one_op_and_the_values_hold():
    x = torch.randn(4, 33) * 8
    g, _ = simplify(capture(from_module(TwoMish(), [x])))
    assert _targets(g).count("aten.tanh.default") == 3  # (export decomposes mish)
    r, notes = recompose_mish(g)
    assert _targets(r).count("aten.mish.default") == 3 and len(notes) == 3
    assert not {"aten.tanh.default", "aten.log1p.default", "aten.exp.default", "aten.where.self"} & set(_targets(r))
    for a, b in zip(run_graph(r, TwoMish(), [x]), run_graph(g, TwoMish(), [x])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert "aten.mish.default" in _targets(rewrite(capture(from_module(TwoMish(), [x])))[0])


def test_other_thresholds_and_other_factors_are_left_alone():
    x, z = torch.randn(4, 8), torch.randn(4, 8)
    g, _ = simplify(capture(from_module(NotMish(), [x, z])))
    r, notes = recompose_mish(g)
    assert not notes and r is g


def test_a_piece_read_elsewhere_stays():
    x = torch.randn(4, 8)
    g, _ = simplify(capture(from_module(MishKept(), [x])))
    r, notes = recompose_mish(g)
    assert len(notes) == 1 and "aten.mish.default" in _targets(r)
    assert "aten.log1p.default" in _targets(r) and "aten.tanh.default" not in _targets(r)
    for a, b in zip(run_graph(r, MishKept(), [x]), run_graph(g, MishKept(), [x])):
        torch.testing.assert_close(a, b)


@pytest.mark.interpreter
def test_the_generated_mish_matches_float64_over_the_whole_range(tmp_path):
    """kw_mish (one exponential, one division) against float64 mish from -100 to 100: relative
    error under 2^-20 and within 4x of ATen's float32 mish; exactly x above 20; NaN for NaN."""
    import triton

    from kernelwright.build.pyload import load_module_from_source
    from kernelwright.codegen.helpers import with_helpers
    src = with_helpers('''
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + o, kw_mish(tl.load(x_ptr + o, mask=o < n)), mask=o < n)
''')
    mod = load_module_from_source(src, "kw_mish_check", str(tmp_path))
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.tensor([0.0, -0.0, 20.0, 20.5, 1e-30, -1e-30, float("nan")])])
    y = torch.empty_like(x)
    mod.k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    ref = F.mish(x.double())
    ok = ~x.isnan()
    err = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-30))[ok]
    eager = ((F.mish(x).double() - ref).abs() / ref.abs().clamp_min(1e-30))[ok]
    assert err.max() < 2.0 ** -20 and err.max() <= 4 * eager.max(), (err.max(), eager.max())  # (2.7e-7, 1.7e-7)
    assert torch.equal(y[x > 20], x[x > 20]) and y[-1].isnan()
