"""Group kernels (codegen/triton_group.py) beyond the basics, run in the Triton interpreter against the
library: views of the domain (group norm), instance norm and variance as Welford passes, split
reductions, training batch norm's running statistics, the channels-last tiled apply pass, and a
pointwise group writing a view of its domain."""
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.capture.shapes import broadcast_strides, refine_strides
from kernelwright.codegen.triton_group import Unsupported, render_group
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module, load_problem

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_refine_strides_splits_and_merges_like_view():
    assert refine_strides((4, 8, 3, 5), (120, 15, 5, 1), (4, 2, 4, 15)) == (120, 60, 15, 1)
    assert refine_strides((4, 8, 15), (120, 15, 1), (4, 2, 4, 15)) == (120, 60, 15, 1)
    assert refine_strides((2, 3), (1, 2), (6,)) is None  # transposed: a view cannot merge it
    assert refine_strides((6,), (1,), (4,)) is None  # element counts differ
    assert broadcast_strides((3, 1), (1, 1), (2, 3, 5)) == (0, 1, 0)
    assert broadcast_strides((4,), (1,), (2, 3)) is None


def _groups_match(model, x, configs):
    """Render every group of `model` with each config and compare with the library values."""
    g = capture(from_module(model, [x]))
    plan = plan_graph(g)
    env = run_graph(g, model, [x], keep=True)
    checked = 0
    for grp in plan.groups:
        for cfg in configs:
            k = render_group(g, grp, cfg)
            mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
            for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
                torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)
                checked += 1
    return plan, checked


ONE = {"BLOCK_M": 2, "BLOCK_R": 256, "one_pass": True, "num_warps": 4}
MULTI = {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4}


def test_group_norm_with_activation_is_one_kernel_over_a_refined_domain():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gn = nn.GroupNorm(4, 8)
            nn.init.normal_(self.gn.weight)
            nn.init.normal_(self.gn.bias)

        def forward(self, x):
            return torch.tanh(self.gn(x))

    plan, checked = _groups_match(M(), torch.randn(3, 8, 5, 3), [ONE, MULTI])
    (grp,) = plan.groups
    assert tuple(grp.domain) == (3, 4, 2, 15) and grp.rdims == (2, 3)
    assert checked == 2


def test_instance_norm_and_var_use_welford_passes():
    torch.manual_seed(0)

    class M(nn.Module):
        def forward(self, x):
            return F.instance_norm(x) + x.var(dim=(2, 3), keepdim=True)

    _, checked = _groups_match(M(), torch.randn(2, 3, 6, 7) * 3 + 5, [ONE, MULTI])
    assert checked >= 2


def test_a_mean_beside_a_variance_of_the_same_values_shares_its_welford_pass():
    """mean(x) and var(x) (a split norm's statistics, instance norm's decomposition) read the data
    once: the multi-pass kernel has one loop over the row, not a sum loop and a Welford loop; a
    mean of other values keeps its own sum. Values match the library, split form included."""
    torch.manual_seed(0)

    class Stats(nn.Module):
        def forward(self, x):
            y = x * 2 + 1
            return y.mean(dim=(2, 3), keepdim=True), y.var(dim=(2, 3), keepdim=True, correction=0), \
                (y * y).mean(dim=(2, 3), keepdim=True)

    x = torch.randn(2, 3, 6, 7) * 3 + 5
    g = capture(from_module(Stats(), [x]))
    (grp,) = plan_graph(g).groups
    src = render_group(g, grp, MULTI).source
    assert src.count("for r0 in range") == 2  # the Welford pass (mean and variance) and y * y's sum
    _groups_match(Stats(), x, [ONE, MULTI, {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4}])


def test_welford_step_reciprocal_keeps_the_variance_exact_with_masked_tails():
    """The Welford loops multiply by one reciprocal per step (triton_group.WELFORD_STEP): rows of
    1000 elements (a masked tail in the last step, a split whose last chunk is partly and one wholly
    past the end) around a mean of 1000 still give the float64 variance to float32 accuracy."""
    torch.manual_seed(1)

    class Var(nn.Module):
        def forward(self, x):
            return x.var(dim=1, keepdim=True)

    x = torch.randn(3, 1000) * 2 + 1000
    g = capture(from_module(Var(), [x]))
    (grp,) = plan_graph(g).groups
    ref = x.double().var(dim=1, keepdim=True)
    for cfg in (MULTI, dict(MULTI, BLOCK_R=64), {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 10, "one_pass": False, "num_warps": 4}):
        k = render_group(g, grp, cfg)
        assert "1.0 / ((r0 - " in k.source
        assert "delta / tl.maximum" not in k.source and "d0 / tl.maximum" not in k.source
        mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
        (out,) = mod.launch(*[x if v == g.user_inputs[0].name else None for v in k.inputs])
        torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=0)


def test_split_reduction_matches_and_refuses_domain_outputs():
    torch.manual_seed(0)
    p = load_problem(os.path.join(ROOT, "problems/level1/mse_loss.py"), small=True)
    g = capture(p)
    model, x = p.make_model(), p.make_inputs(0)
    env = run_graph(g, model, x, keep=True)
    (grp,) = plan_graph(g).groups
    k = render_group(g, grp, {"BLOCK_M": 1, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4})
    assert "_partial" in k.source and "_finish" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
    (out,) = mod.launch(*[env[v] for v in k.inputs])
    torch.testing.assert_close(out, env[k.outputs[0]], rtol=1e-5, atol=1e-6)

    class Softmax(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    xs = torch.randn(2, 40) * 10
    g2 = capture(from_module(Softmax(), [xs]))
    k2 = render_group(g2, plan_graph(g2).groups[0], {"BLOCK_M": 1, "BLOCK_R": 16, "SPLIT": 2, "one_pass": False})
    mod2 = load_module_from_source(k2.source, "softmax_split", os.path.join(ROOT, ".pytest_kw_cache"))
    torch.testing.assert_close(mod2.launch(xs)[0], torch.softmax(xs, -1), rtol=1e-5, atol=1e-6)

    class Centred(nn.Module):  # a sum over values that need the row's max first: not splittable
        def forward(self, x):
            return (x - x.amax(-1, keepdim=True)).sum(-1)

    g3 = capture(from_module(Centred(), [xs]))
    with pytest.raises(Unsupported):
        render_group(g3, plan_graph(g3).groups[0], {"BLOCK_M": 1, "BLOCK_R": 16, "SPLIT": 2, "one_pass": False})


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4},  # partial / finish / apply
    {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4},
    {"BLOCK_M": 4, "BLOCK_R": 256, "one_pass": True, "num_warps": 4},
], ids=["split", "multi", "one"])
def test_training_batch_norm_updates_running_stats_in_the_kernel(cfg):
    """Training-mode batch norm + relu as one group: normalised output and the new running mean and
    (unbiased) variance, also when each channel's statistics are split over several programs."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU())
    nn.init.normal_(m[0].weight)
    nn.init.normal_(m[0].bias)
    m[0].running_mean.normal_()
    m[0].running_var.uniform_(0.5, 2)
    x = torch.randn(4, 3, 5, 7) * 2 + 1
    g = capture(from_module(m, [x]))
    (grp,) = plan_graph(g).groups
    assert {n for n, fqn in g.mutations.items() if "running" in fqn} <= set(grp.outputs)
    env = run_graph(g, m, [x], keep=True)
    k = render_group(g, grp, cfg)
    if "SPLIT" in cfg:
        assert "_apply" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
    for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
        torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_m,block_r,apply_q,reverse", [(1, 64, None, False), (1, 16, None, False),
                                                             (2, 16, None, False), (4, 8, None, False),
                                                             (8, 16, None, False), (2, 16, 4, False),
                                                             (4, 8, 64, False), (2, 16, 4, True), (1, 16, None, True)])
def test_group_norm_over_channels_last_tiled_apply(block_m, block_r, apply_q, reverse):
    """tf32 group norm after a channels-last convolution, returned NCHW: the split schedule's
    apply pass walks [pixels, channels of a group] tiles (reads along channels, writes along
    pixels) and computes the same values as the library."""
    from kernelwright.codegen.triton_group import lower, tiled_apply_dims
    from kernelwright.plan.rewrites import rewrite

    p = load_problem(os.path.join(ROOT, "problems", "level2", "conv2d_group_norm_tanh.py"), small=True)
    g = rewrite(capture(p), "tf32")[0]
    grp = next(x for x in plan_graph(g).groups if x.kind == "normalization")
    low = lower(g, grp)
    Q, P = tiled_apply_dims(low)
    assert Q * P == math.prod(grp.domain[2:]) and P == grp.domain[2]  # pixels x channels of a group
    model = p.make_model()
    with torch.no_grad():
        env = run_graph(g, model, p.make_inputs(2), keep=True)
    # BLOCK_M > 1: neighbouring groups' channels side by side in one tile (8: more rows than M=4)
    # APPLY_Q: the apply tile's height set apart from BLOCK_R (4: fewer pixels than one tile of 64)
    cfg = {"BLOCK_M": block_m, "BLOCK_R": block_r, "SPLIT": 4, "one_pass": False, "num_warps": 4, "TILED_APPLY": True}
    if apply_q:
        cfg["APPLY_Q"] = apply_q
    if reverse:  # APPLY_REVERSE: tiles walked last to first
        cfg["APPLY_REVERSE"] = True
    k = render_group(g, grp, cfg, low)
    assert "tiled walk" in k.source
    assert ("tl.num_programs(1) - 1 - tl.program_id(1)" in k.source) == reverse
    if apply_q:
        assert f"BLOCK_R={apply_q}, num_warps" in k.source.split("_apply, (", 1)[1]
    mod = load_module_from_source(k.source, grp.id + f"_tiled{block_m}x{block_r}q{apply_q}r{int(reverse)}",
                                  os.path.join(ROOT, ".pytest_kw_cache"))
    for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
        torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)


def test_pointwise_group_writes_a_view_of_its_domain():
    """transformer_block's last residual add under bf16: the fc2 GEMM's [B*T, C] result (bf16,
    widened), viewed [B, T, C] and added to x; the group's domain is the GEMM's 2-D shape and
    its output the 3-D view, which one kernel now writes (it was left to two library launches)."""
    from kernelwright.plan.rewrites import rewrite

    p = load_problem(os.path.join(ROOT, "problems", "level3", "transformer_block.py"), small=True)
    g = rewrite(capture(p), "bf16")[0]
    grp = next(x for x in plan_graph(g).groups if x.rdims is None and "aten.add.Tensor" in
               [g.node(n).target for n in x.nodes] and len(g.meta(x.outputs[0]).shape) > len(x.domain))
    with torch.no_grad():
        env = run_graph(g, p.make_model(), p.make_inputs(3), keep=True)
    k = render_group(g, grp, {"BLOCK_M": 64, "BLOCK_R": 1, "num_warps": 4, "num_stages": 1, "one_pass": False})
    mod = load_module_from_source(k.source, grp.id + "_viewout", os.path.join(ROOT, ".pytest_kw_cache"))
    outs = mod.launch(*[env[v] for v in k.inputs])
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    for name, out in zip(k.outputs, outs):
        assert out.shape == env[name].shape
        torch.testing.assert_close(out, env[name], rtol=0, atol=0)


class _BatchNormBackwardSums(nn.Module):
    """The shape of a decomposed batch norm backward: two sums per channel of [N, C, H, W] and a
    per-channel value computed from per-channel parameters alone (invstd * invstd), in three
    orders: computed before the sums, after them, and read first by the node that combines it
    with a sum."""

    def __init__(self, order: str):
        super().__init__()
        self.order = order
        self.mean = nn.Parameter(torch.randn(8))
        self.invstd = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, g):
        if self.order == "before":
            k = self.invstd * self.invstd
        d = g.relu()
        s1 = d.sum((0, 2, 3))
        s2 = (d * (g - self.mean[:, None, None])).sum((0, 2, 3))
        if self.order != "before":
            k = self.invstd * self.invstd
        scaled = k * (s2 * 0.25) if self.order == "first" else (s2 * 0.25) * k
        return s1 * 0.5, scaled


@pytest.mark.parametrize("order", ["before", "after", "first"])
def test_per_channel_values_of_parameters_are_computed_in_the_reduction_kernel(order):
    """Values of one per channel made from per-channel operands only join the reduction group over
    [N, C, H, W] at the row level (one kernel, no launch for eight elements), in every order."""
    torch.manual_seed(0)
    plan, checked = _groups_match(_BatchNormBackwardSums(order), torch.randn(2, 8, 3, 5), [ONE, MULTI])
    assert len(plan.groups) == 1 and plan.groups[0].rdims == (0, 2, 3)
    grp = plan.groups[0]
    g = plan.graph
    prologue = [n for n in grp.nodes if g.node(n).target == "aten.mul.Tensor"
                and all(i not in grp.nodes for i in g.node(n).inputs)]
    assert len(prologue) == 1 and grp.levels[prologue[0]] == "row"
    assert checked == 2 * len(grp.outputs) == 2 * 2
