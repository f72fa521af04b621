"""A convolution with the normalization group after it split around its statistics
(codegen/conv_norm.py): the template's partial statistics against torch's, which groups split and
which do not, and the three kernels against the model in the Triton interpreter (instance, group
and layer norms; 2- and 3-D; row tiles spanning two images and box tiles; fp32, tf32 and bf16)."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import conv_epilogue, conv_norm
from kernelwright.codegen.triton_conv import render_conv
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter
CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".pytest_kw_cache")


def _combined(cnt, mean, m2):
    """Per (image, channel): count, mean and squared deviations' sum of the partials [N, slots, C] (Chan)."""
    total = cnt.sum(1)
    mu = (cnt * torch.where(cnt > 0, mean, 0.0)).sum(1) / total
    return total, mu, torch.where(cnt > 0, m2 + cnt * (mean - mu[:, None]) ** 2, 0.0).sum(1)


@pytest.mark.parametrize("x_shape, w_shape, kw, tile, layout", [
    # 63 pixels per image in tiles of 32: tiles span two images
    ((3, 8, 7, 9), (16, 8, 3, 3), dict(padding=1), dict(BLOCK_M=32), "nchw"),
    ((2, 16, 6, 5), (16, 16, 1, 1), {}, dict(BLOCK_M=16), "cl"),
    ((2, 16, 4, 5, 6), (8, 16, 3, 3, 3), dict(padding=1), dict(BLOCK_M=64), "cl"),
    # boxes (tensor descriptors): one image per tile
    ((2, 16, 6, 8), (16, 16, 3, 3), dict(padding=1), dict(BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8), "cl"),
    ((2, 16, 6, 8), (16, 16, 3, 3), dict(padding=1), dict(BLOCK_M=16, BOX_D=1, BOX_H=1, BOX_W=16), "cl"),
    # padded-grid tiles (80 pixels a padded image, tiles of 16 and 64 rows: spanning two images)
    ((3, 16, 6, 8), (16, 16, 3, 3), dict(padding=1), dict(BLOCK_M=16, FLAT=1), "cl"),
    ((3, 16, 6, 8), (16, 16, 3, 3), dict(padding=1), dict(BLOCK_M=64, FLAT=1), "nchw"),
    # transposed, stride 2: each phase class's tiles fill slots of their own
    ((3, 8, 5, 6), (8, 16, 3, 3), dict(stride=2, padding=1, output_padding=1), dict(BLOCK_M=16), "transposed"),
    ((2, 8, 3, 4, 3), (8, 8, 3, 3, 3), dict(stride=2), dict(BLOCK_M=16), "transposed"),
], ids=["rows-span-images", "1x1", "3d", "box-2x8", "box-wider-than-row", "flat-16", "flat-64", "transposed-2d",
        "transposed-3d"])
def test_the_template_keeps_each_tiles_statistics_per_image_and_channel(x_shape, w_shape, kw, tile, layout):
    torch.manual_seed(0)
    transposed = layout == "transposed"
    name = "kw_convT_stats" if transposed else "kw_conv_stats"
    mod = load_module_from_source(render_conv(name=name, stats=True, transposed=transposed), name, CACHE)
    x, w = torch.randn(*x_shape), torch.randn(*w_shape)
    if layout == "cl":
        x = x.to(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    box = "BOX_W" in tile
    y, cnt, mean, m2 = mod.launch(x, w, **kw, BLOCK_N=16, BLOCK_K=16, **tile, **({"INPUT_PRECISION": "tf32"} if box else {}))
    ref = ((F.conv_transpose2d if x.dim() == 4 else F.conv_transpose3d) if transposed else
           (F.conv2d if x.dim() == 4 else F.conv3d))(x, w, **kw)
    torch.testing.assert_close(y, ref, rtol=3e-2 if box else 1e-4, atol=3e-2 if box else 1e-4)
    total, mu, dev = _combined(cnt, mean, m2)
    flat = y.flatten(2)  # (the statistics are those of the values y holds)
    assert torch.all(total == flat.shape[2])
    torch.testing.assert_close(mu, flat.mean(2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev, flat.var(2, unbiased=False) * flat.shape[2], rtol=1e-4, atol=1e-3)


def test_a_row_tile_wider_than_one_image_is_refused():
    mod = load_module_from_source(render_conv(name="kw_conv_stats", stats=True), "kw_conv_stats", CACHE)
    with pytest.raises(ValueError, match="more than two images"):
        mod.launch(torch.randn(4, 8, 4, 4), torch.randn(16, 8, 1, 1), BLOCK_M=32, BLOCK_N=16, BLOCK_K=16)


class ConvNorm(nn.Module):
    """A convolution, pointwise ops, a norm over each image's channels (group, instance or layer
    norm), pointwise ops after it."""

    def __init__(self, norm="group", nd=2, cin=8, cout=16, pre=True, groups=4):
        super().__init__()
        conv = nn.Conv2d if nd == 2 else nn.Conv3d
        self.conv = conv(cin, cout, 3)
        self.bias = nn.Parameter(torch.randn(cout, *([1] * nd)))
        self.norm = {"group": lambda: nn.GroupNorm(groups, cout),
                     "instance": lambda: (nn.InstanceNorm2d if nd == 2 else nn.InstanceNorm3d)(cout)}[norm]() \
            if norm != "layer" else None
        self.pre = pre

    def forward(self, x):
        y = self.conv(x)
        if self.pre:
            y = torch.sigmoid(y + self.bias) * 3.0
        y = self.norm(y) if self.norm is not None else F.layer_norm(y, y.shape[1:])
        return torch.tanh(y) / 2.0


def _check_launch(text, ins, label, g, model, x, outputs, tol, strides=False):
    """launch() of module `text`, given the graph's values of `ins`, returns the graph's `outputs`:
    each of their dtype and shape, equal within `tol` (with `strides`: a 4-D result in the layout
    the plan gave it)."""
    mod = load_module_from_source(text, label, CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        got = mod.launch(*[env[v] for v in ins])
    assert len(got) == len(outputs)
    for v, res in zip(outputs, got):
        assert res.dtype == env[v].dtype and res.shape == env[v].shape
        if strides and res.dim() == 4:
            assert res.stride() == tuple(g.meta(v).stride)
        torch.testing.assert_close(res.float(), env[v].float(), rtol=tol, atol=tol, msg=lambda m, v=v: f"{v}: {m}")


def _split_pair(model, x, policy):
    g = rewrite(capture(from_module(model.eval(), [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv"]
    return g, plan, pair


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name, model, shape, tile", [
    ("group", lambda: ConvNorm("group"), (2, 8, 10, 12), dict(BLOCK_M=32)),
    ("instance", lambda: ConvNorm("instance", pre=False), (3, 8, 9, 7), dict(BLOCK_M=16)),
    ("layer", lambda: ConvNorm("layer"), (2, 8, 6, 7), dict(BLOCK_M=16)),
    ("group3d", lambda: ConvNorm("group", nd=3, groups=2), (2, 8, 5, 6, 7), dict(BLOCK_M=32)),
    ("instance-box", lambda: ConvNorm("instance", cin=16), (2, 16, 8, 10), dict(BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8)),
    ("residual", lambda: Residual(of_y=True), (2, 4, 7, 9), dict(BLOCK_M=16)),
    ("scaled-both-sides", lambda: ScaledBothSides(), (2, 4, 5, 6, 7), dict(BLOCK_M=32)),
    ("group-of-one-channel", lambda: ConvNorm("group", cout=12, groups=12), (2, 8, 7, 7), dict(BLOCK_M=16)),
    ("grouped-convolution", lambda: GroupedNorm(), (2, 8, 7, 6), dict(BLOCK_M=16)),
    ("min-of-tensor", lambda: MinOfTensor(), (2, 4, 5, 6, 7), dict(BLOCK_M=32)),
    ("transposed", lambda: TransposedNorm(2), (2, 8, 5, 6), dict(BLOCK_M=16)),
    ("transposed3d", lambda: TransposedNorm(3), (2, 8, 3, 4, 3), dict(BLOCK_M=16)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_convolution_the_rows_statistics_and_the_apply_compute_the_group(name, model, shape, tile, policy):
    torch.manual_seed(1)
    model, x = model(), torch.randn(*shape)
    g, plan, pair = _split_pair(model, x, policy)
    node = g.node(pair.anchor)
    assert conv_epilogue.fusable(g, node, pair.group) is None
    fused = conv_epilogue.build(g, node, pair.group, plan.groups)
    split = fused.norm
    assert split is not None and split.count * split.groups == fused.out_shape[1] * (fused.gemm[0] // fused.out_shape[0])
    text, ins = conv_epilogue.render(fused, dict(BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1, **tile), policy,
                                     f"kw_norm_{name}_{policy}".replace("-", "_"))
    mod = load_module_from_source(text, f"kw_norm_{name}_{policy}".replace("-", "_"), CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        want = run_graph(g, model, [x])[0]
    assert res.stride() == tuple(g.meta(fused.out).stride)  # (the layout the plan gave the result)
    tol = {"fp32": 1e-4, "tf32": 3e-3, "bf16": 3e-2}[policy]
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)


class GroupedNorm(nn.Module):
    """A grouped convolution (two groups of 4 channels) and a group norm whose 2 groups of 8
    channels each span both (the statistics are kept per channel)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(8, 16, 3, groups=2), nn.GroupNorm(2, 16)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class ScaledBothSides(nn.Module):
    """One per-channel scale before and after an instance norm (KernelBench's conv - multiply -
    instance norm - clamp - multiply): the apply loads the scale again."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv3d(4, 8, 3), nn.InstanceNorm3d(8)
        self.m = nn.Parameter(torch.rand(8, 1, 1, 1) + 0.5)

    def forward(self, x):
        y = self.norm(self.conv(x) * self.m)
        return torch.clamp(y, -1.0, 1.0) * self.m


class TransposedNorm(nn.Module):
    """A stride-2 transposed convolution, GELU, group norm (KernelBench's ConvTranspose + GroupNorm)."""

    def __init__(self, nd):
        super().__init__()
        conv = nn.ConvTranspose2d if nd == 2 else nn.ConvTranspose3d
        self.conv, self.norm = conv(8, 16, 3, stride=2, padding=1, output_padding=1), nn.GroupNorm(4, 16)

    def forward(self, x):
        return torch.tanh(self.norm(F.gelu(self.conv(x))))


class MinOfTensor(nn.Module):
    """A 0-d tensor read after the norm (KernelBench's conv - group norm - torch.min with a tensor)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv3d(4, 8, 3), nn.GroupNorm(8, 8)

    def forward(self, x):
        y = self.norm(self.conv(x))
        return torch.clamp(torch.min(y, torch.tensor(0.25, device=x.device)), min=-0.5)


class Residual(nn.Module):
    """The convolution's output read again after the norm of a value computed from it: not a
    split (the apply reads the normalized value only; the norm of y itself plus y is one)."""

    def __init__(self, of_y=False):
        super().__init__()
        self.conv, self.norm, self.of_y = nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8), of_y

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y if self.of_y else torch.relu(y)) + y


class Tapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8)

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y), y.mean()


@pytest.mark.parametrize("model, why", [
    (Residual, "reads a value computed before them"),
    (Tapped, "one result"),  # (the planner puts the mean of y and the norm in one group)
    (lambda: nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(1, 8)), "every spatial position"),
], ids=["residual", "tapped", "one-group"])
def test_what_does_not_split(model, why):
    model, x = model().eval(), torch.randn(2, 4, 7, 7)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    conv = next(n for n in g.nodes if n.target == "aten.convolution.default")
    group = next(gr for gr in plan.groups if gr.rdims is not None and any("norm" in n for n in gr.nodes))
    got = conv_norm.match(g, conv, group)
    assert isinstance(got, str) and why in got, got


def test_the_emitted_forward_runs_the_convolution_and_its_norm_as_one_unit(tmp_path):
    """optimize with every generated kernel (--no-library): the convolution and the group norm
    group are one launch whose module holds the statistics and apply kernels; verified."""
    from test_conv_epilogue import emitted_forward  # (the module beside this one)

    torch.manual_seed(2)
    model, x = ConvNorm("group").eval(), torch.randn(2, 8, 10, 12)
    out, body = emitted_forward(model, x, tmp_path)
    launches = [line for line in body.splitlines() if ".launch(" in line]
    assert len([line for line in launches if "_conv.launch(" in line]) == 1, body
    assert "native_group_norm" not in body and "torch.convolution" not in body
    kernel = next(p for p in (out / "kernels").glob("*_conv.py"))
    text = kernel.read_text()
    assert "_stats[" in text and "_apply[" in text
    # the module's header names the fused units as such and the kernel computing them
    header = [line for line in (out / "model_new.py").read_text().splitlines() if line.startswith("#   ")]
    (fused,) = [line[4:].split(" [")[0] for line in header if "[conv_epilogue]" in line and "triton.conv[" in line]
    group = kernel.stem.removesuffix("_conv")
    assert any(line.startswith(f"#   {group} [") and line.endswith(f"fused (computed inside {fused}'s kernel)")
               for line in header), header


class ConvBatchNorm(nn.Module):
    """A convolution, a batch norm and a scale (KernelBench's conv - batch norm - scaling), timed in
    training mode: the norm's rows are channels over every image, and it updates its running
    statistics."""

    def __init__(self, nd=2, transposed=False):
        super().__init__()
        conv = {(2, False): nn.Conv2d, (3, False): nn.Conv3d, (2, True): nn.ConvTranspose2d}[(nd, transposed)]
        self.conv = conv(8, 16, 3, **({"stride": 2} if transposed else {}))
        self.bn = (nn.BatchNorm2d if nd == 2 else nn.BatchNorm3d)(16, momentum=0.3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.bn(self.conv(x)) * 2.0


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name, model, shape", [
    ("2d", lambda: ConvBatchNorm(), (3, 8, 9, 7)),
    ("3d", lambda: ConvBatchNorm(nd=3), (2, 8, 4, 5, 6)),
    ("transposed", lambda: ConvBatchNorm(transposed=True), (2, 8, 4, 5)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_training_batch_norm_takes_its_rows_over_every_image_and_updates_its_running_statistics(
        name, model, shape, policy):
    torch.manual_seed(3)
    model, x = model().train(), torch.randn(*shape)
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv"]
    node = g.node(pair.anchor)
    assert conv_epilogue.fusable(g, node, pair.group) is None
    fused = conv_epilogue.build(g, node, pair.group, plan.groups)
    assert fused.norm.over_batch and len(fused.outputs) == 3  # (the result and the two running statistics)
    text, ins = conv_epilogue.render(fused, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1), policy,
                                     f"kw_bn_{name}_{policy}")
    mod = load_module_from_source(text, f"kw_bn_{name}_{policy}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        got = mod.launch(*[env[v] for v in ins])
    tol = 1e-4 if policy == "fp32" else 3e-3
    for v, res in zip(fused.outputs, got):
        torch.testing.assert_close(res, env[v].to(res.dtype), rtol=tol, atol=tol, msg=lambda m, v=v: f"{v}: {m}")


class NormBeforePool(nn.Module):
    """A convolution, a norm, pointwise ops and a pool (KernelBench's conv - group norm - scale -
    max pool - clamp; a ResNet stem in training mode): plan.norm_split makes the norm statistics
    and a pointwise apply that the pool reads, so the statistics group reads the convolution's
    output beside the apply."""

    def __init__(self, norm="group", nd=2, transposed=False, bias=True):
        super().__init__()
        conv = {(2, False): nn.Conv2d, (3, False): nn.Conv3d, (3, True): nn.ConvTranspose3d}[(nd, transposed)]
        self.conv = conv(8, 16, 3, bias=bias, **({"stride": 2} if transposed else {}))
        self.norm = nn.GroupNorm(4, 16) if norm == "group" else (nn.BatchNorm2d if nd == 2 else nn.BatchNorm3d)(16)
        self.scale = nn.Parameter(torch.rand(16, *([1] * nd)) + 0.5)
        self.pool = (F.max_pool2d if nd == 2 else F.avg_pool3d) if not transposed else F.avg_pool3d
        self.nd = nd

    def forward(self, x):
        y = self.norm(self.conv(x)) * self.scale
        return torch.clamp(self.pool(torch.relu(y), 2), max=0.8)


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name, model, shape, shifted", [
    # the convolution's bias split off and added back by each reader: the statistics move each
    # channel's mean by it
    ("group-bias", lambda: NormBeforePool(), (2, 8, 10, 12), True),
    ("stem-batch-norm", lambda: NormBeforePool("batch", bias=False), (3, 8, 9, 11), False),
    ("group-3d", lambda: NormBeforePool(nd=3), (2, 8, 5, 6, 7), True),
    ("transposed-batch-norm", lambda: NormBeforePool("batch", nd=3, transposed=True), (2, 8, 3, 4, 3), False),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_statistics_of_a_norm_before_a_pool_come_from_the_convolutions_tiles(name, model, shape, shifted, policy):
    torch.manual_seed(4)
    model, x = model().train(), torch.randn(*shape)
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv" and not p.pools]
    node = g.node(pair.anchor)
    assert pair.group.rdims is not None and len(g.users(node.name)) > len(set(pair.group.nodes) & {
        u.name for u in g.users(node.name)})  # (the apply reads the convolution's output too)
    assert conv_epilogue.fusable(g, node, pair.group) is None
    fused = conv_epilogue.build(g, node, pair.group, plan.groups)
    assert fused.norm.stats_only and (fused.norm.shift is not None) == shifted
    assert fused.outputs[0] == node.name and fused.epilogue.empty
    text, ins = conv_epilogue.render(fused, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1), policy,
                                     f"kw_stats_{name}_{policy}".replace("-", "_"))
    assert "_apply" not in text
    mod = load_module_from_source(text, f"kw_stats_{name}_{policy}".replace("-", "_"), CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        got = mod.launch(*[env[v] for v in ins])
    tol = 1e-4 if policy == "fp32" else 3e-3
    assert len(got) == len(fused.outputs) > 2
    for v, res in zip(fused.outputs, got):
        torch.testing.assert_close(res, env[v].to(res.dtype), rtol=tol, atol=tol, msg=lambda m, v=v: f"{v}: {m}")


def test_a_statistics_group_of_another_value_does_not_split():
    """The statistics of conv(x) + c, c a parameter over (channel, h, w) that each reader of the
    convolution's output adds again (plan.norm_split): the kernel keeps statistics of what it
    stores, which is not that sum."""

    class PositionalStats(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 8, 3, bias=False), nn.GroupNorm(2, 8)
            self.c = nn.Parameter(torch.randn(8, 7, 7))

        def forward(self, x):
            return F.max_pool2d(self.norm(self.conv(x) + self.c), 2)

    model, x = PositionalStats(), torch.randn(2, 4, 9, 9)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    conv = next(n for n in g.nodes if n.target == "aten.convolution.default")
    (pair,) = [p for p in plan.pairs if p.anchor == conv.name]
    assert conv.name not in pair.group.outputs and len(g.users(conv.name)) == 2  # (the statistics and the apply)
    got = conv_norm.match(g, conv, pair.group)
    assert isinstance(got, str) and "not of the convolution's output" in got, got
    assert conv_epilogue.fusable(g, conv, pair.group) is not None


@pytest.mark.parametrize("pre, dtype", [(True, torch.float32), (False, torch.bfloat16)], ids=["computed", "widened"])
def test_under_bf16_the_normalized_value_is_held_in_its_own_dtype(pre, dtype):
    """Under bf16 the convolution's result is bf16 and what follows computes in float32. The value a
    split norm normalizes is held between the kernels in the graph's dtype of it: float32 where
    pointwise ops compute it (a bf16 copy of sigmoid(y + b) * 3 would round it again, and the norm
    magnifies that), bf16 where it is the (bias-free) convolution's output widened (exact in half
    the bytes).
    The result is as close to float64 as the graph run by ATen under the same policy."""
    torch.manual_seed(3)
    model = ConvNorm("group", pre=True, groups=8) if pre else nn.Sequential(
        nn.Conv2d(8, 16, 3, bias=False), nn.GroupNorm(8, 16), nn.Tanh())
    model, x = model.eval(), torch.randn(2, 8, 10, 12)
    g, plan, pair = _split_pair(model, x, "bf16")
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert fused.norm is not None and fused.norm_dtype == str(dtype).replace("torch.", "")
    text, ins = conv_epilogue.render(fused, dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1),
                                     "bf16", f"kw_norm_dtype_{pre}")
    assert f"out_dtype={dtype}" in text
    mod = load_module_from_source(text, f"kw_norm_dtype_{pre}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        aten = run_graph(g, model, [x])[0]
        exact = model.double()(x.double())
    assert (res.double() - exact).abs().max() <= 2 * (aten.double() - exact).abs().max() + 1e-3


class PooledActivation(nn.Module):
    """A convolution, a pointwise function of it, then its sum or mean over each image's pixels
    (KernelBench's conv - GELU - global average pool) or over a channel group's pixels too."""

    def __init__(self, nd=2, reduce="gap", transposed=False, groups=1):
        super().__init__()
        conv = {(2, False): nn.Conv2d, (3, False): nn.Conv3d, (2, True): nn.ConvTranspose2d}[nd, transposed]
        self.conv = conv(8, 16, 3, stride=2, padding=1) if transposed else conv(8, 16, 3, groups=groups)
        self.reduce, self.nd = reduce, nd
        self.scale = nn.Parameter(torch.rand(16, *([1] * nd)) + 0.5)

    def forward(self, x):
        y = F.gelu(self.conv(x)) * self.scale
        dims = tuple(range(2, 2 + self.nd))
        if self.reduce == "gap":
            return F.adaptive_avg_pool2d(y, 1).flatten(1) if self.nd == 2 else y.mean(dims)
        if self.reduce == "sum":
            return torch.sigmoid(y.sum(dims, keepdim=True)) * 2.0
        if self.reduce == "batch":  # (one row per channel over every image)
            return y.mean((0, *dims))
        if self.reduce == "centered":  # (the apply pass: each value less its image's channel mean)
            return torch.tanh(y - y.mean(dims, keepdim=True))
        if self.reduce == "gated":
            return y * torch.sigmoid(y.sum(dims, keepdim=True))
        return y.unflatten(1, (4, 4)).mean((2, *[d + 1 for d in dims]))  # (4 channel groups: rows of 4 channels)


class SqueezeExcite(nn.Module):
    """An MBConv's squeeze-and-excitation: the activations scaled by a function of their mean over
    each image's pixels (the sum group returns the activations and their mean)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc1, self.fc2 = nn.Conv2d(8, 16, 3, padding=1), nn.Linear(16, 4), nn.Linear(4, 16)

    def forward(self, x):
        y = F.silu(self.conv(x))
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(y.mean((2, 3))))))
        return y * s[:, :, None, None]


# (name, model, input shape, tile, policies): every policy where the rounding differs most
# (bf16 casts, a returned bf16 value), one or two elsewhere
SUMS = [
    ("gap", lambda: PooledActivation(), (3, 8, 9, 7), dict(BLOCK_M=32), ("fp32", "tf32", "bf16")),
    ("squeeze-excite", lambda: SqueezeExcite(), (2, 8, 6, 7), dict(BLOCK_M=16), ("fp32", "tf32", "bf16")),
    ("sum-3d", lambda: PooledActivation(3, "sum"), (2, 8, 5, 6, 7), dict(BLOCK_M=32), ("tf32",)),
    ("channel-groups", lambda: PooledActivation(2, "groups"), (2, 8, 8, 9), dict(BLOCK_M=16), ("fp32",)),
    ("over-the-batch", lambda: PooledActivation(2, "batch"), (3, 8, 7, 6), dict(BLOCK_M=16), ("bf16",)),
    ("grouped", lambda: PooledActivation(groups=2), (2, 8, 7, 6), dict(BLOCK_M=16), ("tf32",)),
    ("centered", lambda: PooledActivation(2, "centered"), (2, 8, 7, 6), dict(BLOCK_M=16), ("tf32", "bf16")),
    ("gated-3d", lambda: PooledActivation(3, "gated"), (2, 8, 5, 6, 7), dict(BLOCK_M=32), ("fp32",)),
    ("depthwise", lambda: PooledActivation(groups=8), (2, 8, 7, 6), dict(BLOCK_M=16), ("fp32", "bf16")),
    ("box", lambda: PooledActivation(), (2, 8, 8, 10), dict(BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8), ("tf32", "bf16")),
    ("transposed", lambda: PooledActivation(2, "gap", True), (2, 8, 6, 7), dict(BLOCK_M=16), ("fp32", "bf16")),
]


@pytest.mark.parametrize("name, model, shape, tile, policy",
                         [(*case[:4], policy) for case in SUMS for policy in case[4]],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_sum_over_each_images_pixels_needs_no_convolution_output(name, model, shape, tile, policy):
    """A sum group (a sum or mean of a pointwise function of the convolution's output over each
    image's pixels): the convolution writes nothing but its tiles' partial statistics (or, where
    the group returns the summed value too, that value), whose row sums are the group's; then its
    statements of one per row."""
    torch.manual_seed(5)
    model, x = model(), torch.randn(*shape)
    if "BOX_W" in tile:  # (boxes read 16 or more channels)
        model.conv = nn.Conv2d(16, 16, 3)
        x = torch.randn(shape[0], 16, *shape[2:])
    g, plan, pair = _split_pair(model, x, policy)
    node = g.node(pair.anchor)
    assert conv_epilogue.fusable(g, node, pair.group) is None
    fused = conv_epilogue.build(g, node, pair.group, plan.groups)
    # the activations returned too: the convolution writes them; a value computed from them and the
    # sums: the convolution writes them and the apply pass reads them once
    writes, applies = name in ("squeeze-excite", "centered", "gated-3d"), name in ("centered", "gated-3d")
    assert fused.norm.sums and not fused.norm.stats_only and node.name not in fused.outputs
    assert fused.norm.writes == writes and fused.norm.direct == (writes and not applies)
    assert len(fused.outputs) == 1 + (writes and not applies)
    text, ins = conv_epilogue.render(fused, dict(BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1, **tile), policy,
                                     f"kw_sum_{name}_{policy}".replace("-", "_"))
    wrapper = text.split("_conv_launch = launch")[1]
    assert ("_apply" in text) == applies and ("write_y=False" in wrapper) != writes
    tol = {"fp32": 1e-4, "tf32": 3e-3, "bf16": 3e-2}[policy]
    # (the written activations: in the layout the plan gave them)
    _check_launch(text, ins, f"kw_sum_{name}_{policy}".replace("-", "_"), g, model, x, fused.outputs, tol, strides=True)


def test_a_sum_whose_convolution_output_is_read_elsewhere_does_not_split():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3)

        def forward(self, x):
            y = self.conv(x)
            return torch.relu(y).mean((2, 3)), y * 2.0

    model, x = Both(), torch.randn(2, 4, 7, 7)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    conv = next(n for n in g.nodes if n.target == "aten.convolution.default")
    group = next(gr for gr in plan.groups if gr.rdims is not None)
    got = conv_norm.match(g, conv, group)
    assert isinstance(got, str), got


class DepthwiseBlock(nn.Module):
    """An MBConv's depthwise stage: a depthwise convolution, batch norm, ReLU6 ("bn"; in training
    mode a split norm over every image), or squeeze-and-excitation after SiLU ("se": a sum group
    returning the activations and their mean)."""

    def __init__(self, kind, k=3, stride=1):
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(8, 8, k, stride=stride, padding=k // 2, groups=8, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "bn":
            return F.relu6(self.bn(y))
        y = F.silu(y)
        return y * torch.sigmoid(self.fc(y.mean((2, 3))))[:, :, None, None]


@pytest.mark.parametrize("name, model, shape, config, policy", [
    ("bn-tiles", lambda: DepthwiseBlock("bn"), (3, 8, 9, 7), dict(BLOCK_M=16, BLOCK_N=4, BLOCK_W=8), "fp32"),
    ("bn-rows", lambda: DepthwiseBlock("bn"), (3, 8, 9, 7), dict(BLOCK_M=8, BLOCK_N=4, ROWS=4), "bf16"),
    ("bn-5x5-stride2", lambda: DepthwiseBlock("bn", 5, 2), (2, 8, 11, 9), dict(BLOCK_M=16, BLOCK_N=8), "tf32"),
    ("se-rows", lambda: DepthwiseBlock("se"), (2, 8, 6, 7), dict(BLOCK_M=8, BLOCK_N=8, ROWS=2), "tf32"),
    ("se-tiles", lambda: DepthwiseBlock("se", 5, 2), (2, 8, 11, 9), dict(BLOCK_M=32, BLOCK_N=4), "bf16"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_depthwise_convolutions_statistics_come_from_the_direct_kernel(name, model, shape, config, policy):
    """A depthwise convolution's training-mode batch norm and its squeeze-and-excitation sum split
    around the direct depthwise kernel's per-program partial statistics (pixel tiles and
    row-streaming programs alike): the normalized result, the new running statistics and the
    summed activations equal the graph's."""
    torch.manual_seed(6)
    model, x = model(), torch.randn(*shape)
    model = model.train() if model.kind == "bn" else model.eval()
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv"]
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert fused.norm is not None and conv_epilogue.direct_depthwise(fused) is None
    assert fused.norm.over_batch == (model.kind == "bn") and fused.norm.sums == (model.kind == "se")
    label = f"kw_dw_{name}_{policy}".replace("-", "_")
    text, ins = conv_epilogue.render_direct(fused, config, label)
    assert "tl.dot" not in text and "_stats[(" in text
    _check_launch(text, ins, label, g, model, x, fused.outputs, {"fp32": 1e-4, "tf32": 1e-4, "bf16": 3e-2}[policy])


class ExpandDepthwise(nn.Module):
    """An MBConv in training mode (KernelBench level-3 21): 1x1 expand, batch norm, ReLU6,
    depthwise 5 x 5 at stride 2, batch norm, ReLU6, 1x1 project, batch norm."""

    def __init__(self):
        super().__init__()
        self.expand, self.bn0 = nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bn1 = nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8, bias=False), nn.BatchNorm2d(8)
        self.project, self.bn2 = nn.Conv2d(8, 4, 1, bias=False), nn.BatchNorm2d(4)

    def forward(self, x):
        y = F.relu6(self.bn1(self.dw(F.relu6(self.bn0(self.expand(x))))))
        return self.bn2(self.project(y))


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_the_direct_depthwise_kernel_keeps_the_statistics_of_a_split_batch_norm_and_applies_the_one_before(
        policy, monkeypatch):
    """At sizes where a training batch norm splits into statistics and an apply (plan.norm_split),
    the depthwise convolution's unit is the direct kernel applying the previous batch norm and ReLU6
    as it loads its input and keeping its own output's statistics: the output, the batch statistics
    and the running statistics equal the graph's."""
    from kernelwright.plan import norm_split

    monkeypatch.setattr(norm_split, "CONV_SPLIT_MIN_ROW", 0)
    torch.manual_seed(7)
    model, x = ExpandDepthwise().train(), torch.randn(2, 4, 11, 9)
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv" and g.node(p.anchor).args[8] == 8]
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups, pair.pools, pair.post)
    # (the depthwise batch norm's apply is the project convolution's prologue: this unit keeps the
    # statistics alone)
    assert fused.norm.stats_only and not fused.prologue.empty and conv_epilogue.direct_depthwise(fused) is None
    label = f"kw_dw_split_{policy}"
    text, ins = conv_epilogue.render_direct(fused, dict(BLOCK_M=16, BLOCK_N=8, num_warps=1), label)
    _check_launch(text, ins, label, g, model, x, fused.outputs, 1e-4)
