"""Every elementwise op the issue names, through capture -> plan -> Triton group kernel (interpreter)."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan import plan_graph
from kernelwright.codegen.triton_group import render_group
from kernelwright.problem import from_module
from fn_module import Fn

pytestmark = pytest.mark.interpreter

OPS = {
    "relu": F.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "gelu_erf": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "softplus": F.softplus, "softsign": F.softsign,
    "elu": F.elu, "selu": F.selu, "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.5), "clamp": lambda x: torch.clamp(x, -0.3, 0.7),
    "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 0.1), "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5), "abs": torch.abs, "pow2": lambda x: x ** 2,
    "pow3": lambda x: x ** 3, "pow_frac": lambda x: x.abs() ** 1.7, "where": lambda x: torch.where(x > 0, x, 0.1 * x),
    "arith": lambda x: (x + 1.5) * 2 / 3 - 0.25, "neg_recip": lambda x: -1 / (x.abs() + 1),
    "maximum": lambda x: torch.maximum(x, x.flip(-1)), "expm1": torch.expm1, "log1p": lambda x: torch.log1p(x.abs()),
}


class Broadcast(nn.Module):
    """Per-column, per-row and scalar operands broadcast against a [rows, cols] input."""

    def __init__(self):
        super().__init__()
        self.col = nn.Parameter(torch.randn(24))
        self.row = nn.Parameter(torch.randn(6, 1))

    def forward(self, x, s):
        return (x * self.col + self.row) / (s.abs() + 1) - torch.sigmoid(self.row)


def _check(model, inputs, rtol=1e-5, atol=1e-5):
    g = capture(from_module(model, inputs))
    plan = plan_graph(g)
    env = run_graph(g, model, inputs, keep=True)
    assert plan.groups, "expected at least one fusion group"
    for grp in plan.groups:
        k = render_group(g, grp, {"BLOCK_M": 64, "BLOCK_R": 1, "one_pass": False, "num_warps": 4})
        mod = load_module_from_source(k.source, grp.id, os.path.join(os.path.dirname(__file__), "..", "..", ".pytest_kw_cache"))
        for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
            torch.testing.assert_close(out, env[name], rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(OPS))
def test_elementwise_op_matches_pytorch(name):
    torch.manual_seed(0)
    _check(Fn(OPS[name]), [torch.randn(6, 24) * 2])


def test_broadcast_operands():
    torch.manual_seed(0)
    _check(Broadcast(), [torch.randn(6, 24), torch.randn(())])


def test_eval_batch_norm_is_elementwise_with_per_channel_statistics():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    nn.init.normal_(bn.weight)
    nn.init.normal_(bn.bias)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2)
    model = nn.Sequential(bn, nn.ReLU()).eval()
    x = torch.randn(2, 3, 4, 5)
    g = capture(from_module(model, [x]))
    (grp,) = plan_graph(g).groups
    assert grp.kind == "pointwise" and len(grp.nodes) >= 3  # batch norm, getitem, relu in one kernel
    _check(model, [x])


class RoundTrip(nn.Module):
    """float32 -> bfloat16 -> float32 with arithmetic around it: one group with a narrowing cast."""

    def forward(self, x):
        return (x * 1.0).to(torch.bfloat16).to(torch.float32) + 0.0


def _bf16_edge_values() -> torch.Tensor:
    halfway = torch.arange(0, 1 << 16, 7, dtype=torch.int64).mul(1 << 16).add(1 << 15).to(torch.int32)
    ties = halfway.view(torch.float32)  # exactly between two bf16 neighbours: ties to even decide
    ties = ties[torch.isfinite(ties)]
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3961e38, -3.3961e38, 0.0, -0.0,
                            1e-40, -7.3e-39, 1.17e-38])  # overflow to inf, signed zeros, subnormals
    return torch.cat([special, ties, ties.nextafter(torch.tensor(float("inf"))), torch.randn(4096)])


def test_bf16_cast_rounds_to_nearest_even_like_torch():
    """The interpreter truncates float32 -> bf16 casts (Triton 3.6); generated kernels round to the
    nearest even there too (kw_round_bf16), so CPU verification compares the GPU's arithmetic."""
    x = _bf16_edge_values()
    g = capture(from_module(RoundTrip(), [x]))
    plan = plan_graph(g)
    (grp,) = plan.groups
    k = render_group(g, grp, {"BLOCK_M": 256, "BLOCK_R": 1, "one_pass": False, "num_warps": 4})
    assert "kw_round_bf16" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(os.path.dirname(__file__), "..", "..", ".pytest_kw_cache"))
    out = mod.launch(x)[k.outputs.index(g.outputs[0])]
    want = RoundTrip()(x)
    same = (out.view(torch.int32) == want.view(torch.int32)) | (out.isnan() & want.isnan())
    assert bool(same.all()), f"{int((~same).sum())} of {x.numel()} differ, e.g. {x[~same][:4].tolist()}"


class RowSum(nn.Module):
    """A bf16 row sum whose result is bf16: the reduction's float32 total stored into a bf16 output."""

    def forward(self, x):
        return x.sum(-1)


def test_a_bf16_result_is_stored_rounded_to_nearest_like_torch():
    """Rows of 63 fours and one 7.5 sum exactly to 259.5 in float32, which bf16 (steps of 2 there)
    rounds to 260; a store that truncated would give 258. The group kernel stores torch's value."""
    x = torch.full((6, 64), 4.0, dtype=torch.bfloat16)
    x[:, 5] = 7.5
    g = capture(from_module(RowSum(), [x]))
    (grp,) = plan_graph(g).groups
    k = render_group(g, grp, {"BLOCK_M": 8, "BLOCK_R": 32, "one_pass": False, "num_warps": 4})
    assert "kw_cast_out" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(os.path.dirname(__file__), "..", "..", ".pytest_kw_cache"))
    (out,) = mod.launch(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, RowSum()(x)) and out[0].item() == 260.0
