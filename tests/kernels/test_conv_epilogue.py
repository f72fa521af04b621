"""Convolution + epilogue fusion (codegen/conv_epilogue.py): which groups reading a convolution's
result fold into the implicit-GEMM convolution, how operands are viewed over the output's dims,
the input copies and casts it absorbs, and the fused kernels against the graph's values in the
Triton interpreter (1-, 2- and 3-D, grouped, transposed; fp32, tf32 and bf16 policies)."""
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.analyze.device import H200
from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import conv_epilogue
from kernelwright.codegen.triton_group import Unsupported
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module
from kernelwright.space.conv_space import BOX_KEYS, conv_space

pytestmark = pytest.mark.interpreter
CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".pytest_kw_cache")
TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4, "num_stages": 1}


class ConvAct(nn.Module):
    def __init__(self, conv, residual=None):
        super().__init__()
        self.conv = conv
        self.scale = nn.Parameter(torch.rand(conv.out_channels, *([1] * (conv.weight.dim() - 2))) + 0.5)
        if residual is None:
            self.residual = None
        else:
            self.register_buffer("residual", residual)

    def forward(self, x):
        y = self.conv(x)
        y = F.gelu(y * self.scale + 0.25)
        if self.residual is not None:
            y = y + self.residual
        return torch.clamp(y, -1.0, 1.5)


def _pair(model, x, policy):
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv"]
    return g, plan, pair


def _run_fused(g, plan, pair, model, x, policy, name):
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    text, ins = conv_epilogue.render(fused, TILE, policy, name)
    mod = load_module_from_source(text, name, CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
    (res,) = mod.launch(*[env[v] for v in ins])
    want = env[pair.group.outputs[0]]
    # the layout the plan gives the group's output (the library's may differ: channels-last in, NCHW kept)
    assert res.shape == want.shape and res.dtype == want.dtype
    assert res.stride() == tuple(g.meta(pair.group.outputs[0]).stride)
    return fused, res, want, text


CASES = [
    ("conv1d", lambda: nn.Conv1d(5, 6, 3, padding=1), (2, 5, 9)),
    ("conv2d_strided", lambda: nn.Conv2d(3, 8, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2)), (2, 3, 9, 8)),
    ("conv2d_grouped", lambda: nn.Conv2d(4, 6, 3, groups=2), (1, 4, 7, 7)),
    ("conv3d", lambda: nn.Conv3d(3, 4, 3, padding=1), (1, 3, 4, 5, 5)),
    ("convT2d", lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (2, 4, 4, 5)),
    ("convT3d", lambda: nn.ConvTranspose3d(3, 4, (2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)), (1, 3, 3, 4, 4)),
]


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name, make, shape", CASES, ids=[c[0] for c in CASES])
def test_fused_conv_matches_graph(name, make, shape, policy):
    torch.manual_seed(0)
    model = ConvAct(make()).eval()
    x = torch.randn(shape)
    g, plan, pair = _pair(model, x, policy)
    fused, res, want, _ = _run_fused(g, plan, pair, model, x, policy, f"conv_epi_{name}_{policy}")
    # the bias (split off the convolution) and the per-channel scale are "col" operands, loaded once per channel
    assert [o.kind for o in fused.epilogue.operands].count("col") >= 2
    tol = 2e-2 if policy == "bf16" else 1e-4
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)
    if policy == "bf16":  # the bf16 copy of the model input is absorbed: the kernel reads x itself
        assert fused.cast_bf16 and g.is_input(fused.x) and fused.absorbed


def test_channels_last_copy_absorbed_and_residual_broadcast():
    """Under tf32 the 2-D convolution runs channels-last: the fused kernel reads the NCHW input
    itself (the copy is absorbed), and a residual broadcast over the batch ([1, C, H, W]) is a
    "full" operand read through a stride-0 view, not copied."""
    torch.manual_seed(1)
    res = torch.randn(1, 8, 7, 7)
    model = ConvAct(nn.Conv2d(3, 8, 3), residual=res).eval()
    x = torch.randn(2, 3, 9, 9)
    g, plan, pair = _pair(model, x, "tf32")
    fused, out, want, _ = _run_fused(g, plan, pair, model, x, "tf32", "conv_epi_cl_res")
    assert g.is_input(fused.x) and fused.absorbed_nodes and not fused.cast_bf16
    full = [view for op, view in zip(fused.epilogue.operands, fused.views) if op.kind == "full"]
    assert len(full) == 1 and full[0][1][0] == 0  # batch stride 0: broadcast
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


class PreAct(nn.Module):
    """An eval-mode batch norm and ReLU (scaled) before a convolution, as DenseNet and pre-activation
    ResNet layers run them; `tap`: the activation is a model output too; `residual`: a tensor of the
    input's shape is added before the convolution."""

    def __init__(self, conv, tap=False, residual=False):
        super().__init__()
        c = conv.in_channels
        self.bn, self.conv, self.tap, self.residual = nn.BatchNorm2d(c) if conv.weight.dim() == 4 else \
            nn.BatchNorm3d(c), conv, tap, residual
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)
        self.bn.bias.data.uniform_(0.2, 1)  # (so that the prologue of a padding zero is not zero)

    def forward(self, x, r=None):
        a = torch.relu(self.bn(x)) * 0.5
        if self.residual:
            a = a + r
        y = torch.tanh(self.conv(a))
        return (y, a) if self.tap else y


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name,conv,shape", [
    ("conv2d", lambda: nn.Conv2d(16, 8, 3, padding=1), (2, 16, 6, 9)),
    ("grouped_strided", lambda: nn.Conv2d(6, 4, 3, stride=2, padding=2, dilation=2, groups=2), (1, 6, 9, 8)),
    ("convT2d", lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1), (1, 4, 4, 5)),
], ids=["conv2d", "grouped_strided", "convT2d"])
def test_input_prologue_absorbs_the_pointwise_group_before_the_convolution(name, conv, shape, policy):
    """The batch norm and activation computing the convolution's input (and the layout copy or bf16
    cast after them) are absorbed: the kernel reads the norm's input and applies the group as the
    prologue of its loads (the running statistics, weight and bias as per-channel operands, the
    padding after the prologue), with the epilogue group after the convolution."""
    torch.manual_seed(3)
    model, x = PreAct(conv()).eval(), torch.randn(*shape)
    g, plan, pair = _pair(model, x, policy)
    fused, res, want, text = _run_fused(g, plan, pair, model, x, policy, f"conv_pro_{name}_{policy}")
    assert g.is_input(fused.x) and not fused.prologue.empty
    assert [o.kind for o in fused.prologue.operands].count("col") >= 2 and len(fused.absorbed) >= 1
    assert fused.cast_bf16 == (policy == "bf16")
    assert "_prologue(a, " in text
    with torch.no_grad():
        want = model(x)
    tol = 2e-2 if policy == "bf16" else 1e-4
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)


def test_input_prologue_only_for_a_group_the_convolution_alone_reads():
    """No prologue where the group's result is read elsewhere too (a model output) or where the
    group reads a second tensor of the input's shape (a residual added before the convolution)."""
    x = torch.randn(1, 4, 6, 6)
    for model, inputs in ((PreAct(nn.Conv2d(4, 4, 3), tap=True), [x]),
                          (PreAct(nn.Conv2d(4, 4, 3), residual=True), [x, torch.randn(1, 4, 6, 6)])):
        g = rewrite(capture(from_module(model.eval(), inputs)), "fp32")[0]
        plan = plan_graph(g)
        (pair,) = [p for p in plan.pairs if p.kind == "conv"]
        fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
        assert fused.prologue.empty and not fused.absorbed and not g.is_input(fused.x)


class PoolConv(nn.Module):
    """An Inception module's pool branch: max pool (stride 1, the input's shape kept), a convolution, bias, ReLU."""

    def __init__(self, pool, conv, tap=False):
        super().__init__()
        self.pool, self.conv, self.tap = pool, conv, tap

    def forward(self, x):
        p = self.pool(x)
        y = torch.relu(self.conv(p))
        return (y, p) if self.tap else y


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name, pool, conv, shape", [
    ("2d_1x1", lambda: nn.MaxPool2d(3, 1, 1), lambda: nn.Conv2d(16, 8, 1), (2, 16, 5, 6)),
    ("2d_3x3", lambda: nn.MaxPool2d(3, 1, 1), lambda: nn.Conv2d(16, 8, 3, padding=1), (1, 16, 4, 5)),
    ("3d", lambda: nn.MaxPool3d(3, 1, 1), lambda: nn.Conv3d(16, 4, 1), (1, 16, 3, 4, 4)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_max_pool_before_the_convolution_is_pooled_as_it_loads(name, pool, conv, shape, policy):
    """The max pool (and its layout copy) the convolution alone reads is absorbed: the kernel reads
    the pool's input and takes each window's max as it loads; no box configs."""
    torch.manual_seed(4)
    model, x = PoolConv(pool(), conv()).eval(), torch.randn(*shape)
    g, plan, pair = _pair(model, x, policy)
    fused, res, want, text = _run_fused(g, plan, pair, model, x, policy, f"conv_inpool_{name}_{policy}")
    assert g.is_input(fused.x) and fused.in_pool is not None and fused.prologue.empty
    assert any("max_pool" in n for n in fused.absorbed) and fused.box_out(g, policy) is None
    assert "propagate_nan=tl.PropagateNan.ALL" in text
    with torch.no_grad():
        torch.testing.assert_close(res, model(x), rtol=1e-4, atol=1e-4)


def emitted_forward(model, x, tmp_path, precision="tf32"):
    """optimize `model` on `x` with every generated kernel (--no-library) on the CPU, verified
    against eager and kept: (its output folder, the body of its generated forward)."""
    from kernelwright.pipeline import Options, optimize_problem

    out = tmp_path / "out"
    result = optimize_problem(from_module(model, [x]), out, Options(
        device="cpu", budget_trials=2, no_library=True, precision=precision, db_path=str(tmp_path / "db.jsonl"),
        log=lambda s: None))
    assert result["verify"]["passed"] and not result.get("verify_fallback")
    return out, (out / "model_new.py").read_text().split("def _kw_forward_any", 1)[1].split("\n\n\n", 1)[0]


def test_the_emitted_forward_runs_no_pool_where_the_convolution_absorbs_it(tmp_path):
    """optimize with every generated kernel (--no-library): the forward launches the convolution on
    the pool's input and computes neither the pool nor its getitem; verified against eager."""
    model, x = PoolConv(nn.MaxPool2d(3, 1, 1), nn.Conv2d(16, 8, 1)).eval(), torch.randn(2, 16, 5, 6)
    _, body = emitted_forward(model, x, tmp_path)
    assert "launch(x, " in body and "max_pool" not in body and "getitem" not in body


class PoolBranchCat(nn.Module):
    """An Inception module in little: a 1x1 convolution and the pool branch of one input, joined."""

    def __init__(self):
        super().__init__()
        self.pool, self.proj, self.conv = nn.MaxPool2d(3, 1, 1), nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return torch.cat([torch.relu(self.conv(x)), torch.relu(self.proj(self.pool(x)))], 1)


def test_the_pool_branch_convolution_reads_the_channels_last_copy_the_other_branch_reads(tmp_path):
    """Under tf32 the input's channels-last copy exists for the 1x1 branch: the pool-branch
    convolution pools that copy as it loads it (channels contiguous), not the NCHW input."""
    torch.manual_seed(5)
    model, x = PoolBranchCat().eval(), torch.randn(2, 16, 5, 6)
    _, body = emitted_forward(model, x, tmp_path)
    launches = [line for line in body.splitlines() if "_conv.launch(" in line]
    assert len(launches) == 2 and all("launch(x_cl, " in line for line in launches), body
    assert "max_pool" not in body and "getitem" not in body


@pytest.mark.parametrize("pool, tap", [(lambda: nn.MaxPool2d(3, 2, 1), False), (lambda: nn.MaxPool2d(2, 1), False),
                                       (lambda: nn.MaxPool2d(3, 1, 1, dilation=2), False),
                                       (lambda: nn.MaxPool2d(3, 1, 1), True),
                                       (lambda: nn.MaxPool2d(3, 1, 1, return_indices=True), False)])
def test_a_pool_that_changes_the_shape_or_is_read_elsewhere_is_not_absorbed(pool, tap):
    class Indices(nn.Module):  # the indices read too
        def __init__(self):
            super().__init__()
            self.pool, self.conv = pool(), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            p, i = self.pool(x)
            return self.conv(p), i

    model = Indices() if getattr(pool(), "return_indices", False) else PoolConv(pool(), nn.Conv2d(4, 4, 1), tap)
    g = rewrite(capture(from_module(model.eval(), [torch.randn(1, 4, 7, 7)])), "fp32")[0]
    plan = plan_graph(g)
    conv = next(n for n in g.nodes if n.target == "aten.convolution.default")
    pair = next((p for p in plan.pairs if p.anchor == conv.name), None)
    fused = conv_epilogue.build(g, conv, pair.group if pair else None, plan.groups)
    assert fused.in_pool is None and not any("max_pool" in n for n in fused.absorbed)


def test_operands_in_another_layout_than_the_graphs_are_copied_into_it():
    """The fused kernel views each operand through strides taken from the graph; an operand that
    arrives in another layout (a library op returning channels-last where the graph's metadata
    says contiguous) is copied into the graph's layout first, not reinterpreted."""
    torch.manual_seed(4)
    res = torch.randn(2, 8, 7, 7)
    model = ConvAct(nn.Conv2d(3, 8, 3), residual=res).eval()
    x = torch.randn(2, 3, 9, 9)
    g, plan, pair = _pair(model, x, "fp32")
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    (full,) = [v for op, v in zip(fused.epilogue.operands, fused.operands) if op.kind == "full"]
    assert fused.layouts[full] == (tuple(g.meta(full).shape), tuple(g.meta(full).stride))
    text, ins = conv_epilogue.render(fused, TILE, "fp32", "conv_epi_layouts")
    assert f"_expect(a{ins.index(full)}," in text
    mod = load_module_from_source(text, "conv_epi_layouts", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        args = [env[v] for v in ins]
        args[ins.index(full)] = args[ins.index(full)].contiguous(memory_format=torch.channels_last)
        (res_out,) = mod.launch(*args)
        torch.testing.assert_close(res_out, model(x), rtol=1e-4, atol=1e-4)


def test_conv_alone_with_bias():
    """The convolution as a node (no group): its bias is the epilogue."""
    torch.manual_seed(2)
    model = nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    g = capture(from_module(model, [x]))
    (conv,) = [n for n in g.nodes if n.target == conv_epilogue.CONV]
    fused = conv_epilogue.build(g, conv, None)
    assert [o.kind for o in fused.epilogue.operands] == ["col"] and fused.out == conv.name
    text, ins = conv_epilogue.render(fused, TILE, "fp32", "conv_alone_bias")
    mod = load_module_from_source(text, "conv_alone_bias", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        torch.testing.assert_close(res, model(x), rtol=1e-4, atol=1e-4)


def test_not_fusable_reasons():
    """A group reducing over the pixels other than by a sum (a sum or mean is a sum group:
    tests/kernels/test_conv_norm.py), a second reader of the convolution's output, a returned
    convolution output."""
    x = torch.randn(1, 3, 6, 6)

    class Reduce(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.relu(self.conv(x)).amax(dim=(2, 3))

    class Both(Reduce):
        def forward(self, x):
            y = self.conv(x)
            return y, torch.relu(y)

    for model, word in ((Reduce(), "reduces"), (Both(), "one value")):
        g = rewrite(capture(from_module(model, [x])), "fp32")[0]
        plan = plan_graph(g)
        reasons = [conv_epilogue.fusable(g, g.node(p.anchor), p.group) for p in plan.pairs if p.kind == "conv"]
        conv = next(n for n in g.nodes if n.target == conv_epilogue.CONV)
        groups = [gr for gr in plan.groups if conv.name in gr.inputs]
        reasons += [conv_epilogue.fusable(g, conv, gr) for gr in groups]
        assert any(r and word in r for r in reasons), reasons
        with pytest.raises(Unsupported):
            conv_epilogue.build(g, conv, groups[0])


def test_output_view_splits_merged_domain_dims():
    """An operand's strides over a coarser domain ([N, C, H*W]) become strides over [N, C, H, W]."""
    assert conv_epilogue.output_view((0, 1, 0), (2, 4, 36), (2, 4, 6, 6)) == (0, 1, 0, 0)
    assert conv_epilogue.output_view((144, 36, 1), (2, 4, 36), (2, 4, 6, 6)) == (144, 36, 6, 1)
    with pytest.raises(Unsupported):
        conv_epilogue.output_view((1, 1), (3, 96), (2, 4, 6, 6))


class ConvPool(nn.Module):
    """conv -> pre (pointwise or a channel softmax) -> pools -> post (pointwise)."""

    def __init__(self, conv, pools, pre="act", post=True):
        super().__init__()
        self.conv, self.pools, self.pre, self.post = conv, nn.ModuleList(pools), pre, post
        self.bias = nn.Parameter(torch.randn(conv.out_channels, *([1] * (conv.weight.dim() - 2))))

    def forward(self, x):
        y = self.conv(x)
        if self.pre == "act":
            y = torch.tanh(y) * 2.0
        elif self.pre == "softmax":
            y = torch.softmax(y, dim=1)
        for p in self.pools:
            y = p(y)
        return F.hardswish(y + self.bias) if self.post else y


POOL_CASES = [
    ("max2d_post", lambda: ConvPool(nn.Conv2d(3, 6, 3, padding=1), [nn.MaxPool2d(2)], pre=None), (2, 3, 9, 10)),
    ("act_max2d_post", lambda: ConvPool(nn.Conv2d(3, 5, (3, 2), stride=(1, 2)), [nn.MaxPool2d((2, 4))]), (2, 3, 10, 17)),
    ("avg2d", lambda: ConvPool(nn.Conv2d(4, 6, 3, groups=2), [nn.AvgPool2d(2)], post=False), (1, 4, 9, 9)),
    ("max3x3_padded_window", lambda: ConvPool(nn.Conv2d(3, 4, 3), [nn.MaxPool2d(3)], pre=None), (1, 3, 11, 12)),
    ("avg3d_1x3x3", lambda: ConvPool(nn.Conv3d(3, 4, 3), [nn.AvgPool3d((1, 3, 3))], post=False), (1, 3, 4, 9, 8)),
    ("softmax_max3d_twice", lambda: ConvPool(nn.Conv3d(3, 6, 3), [nn.MaxPool3d(2), nn.MaxPool3d(2)], pre="softmax",
                                             post=False), (2, 3, 11, 10, 11)),
]


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name,make,shape", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_conv_pool_chain_matches_graph(name, make, shape, policy):
    """The chain pair (conv, its group, the pools, the group after them) as one kernel writing only
    the pooled result; windows of several pools compose into one (2 then 2 = 4)."""
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape)
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.pools]
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups, pair.pools, pair.post)
    assert fused.pool == ("avg" if name.startswith("avg") else "max")
    sizes = {"softmax_max3d_twice": 64, "act_max2d_post": 8, "max3x3_padded_window": 9, "avg3d_1x3x3": 9}
    assert math.prod(fused.pool_window) == sizes.get(name, 4)
    assert fused.whole_n == ("softmax" in name)
    tile = dict(TILE, BLOCK_M=max(16, 2 << (math.prod(fused.pool_window) - 1).bit_length()))
    text, ins = conv_epilogue.render(fused, tile, policy, f"conv_pool_{name}_{policy}")
    mod = load_module_from_source(text, f"conv_pool_{name}_{policy}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        want = model(x)
    assert fused.out == g.outputs[0] and res.shape == want.shape
    tol = 1e-4 if policy == "fp32" else 2e-2
    torch.testing.assert_close(res, want, rtol=tol, atol=tol)


# box configs of pool-fused convolutions: (name, model, input shape, box); boxes past the output's
# edge and past its last whole window (floor mode), windows over one to three axes
POOL_BOX_CASES = [
    ("max2d_ragged", lambda: ConvPool(nn.Conv2d(16, 24, 3, padding=1), [nn.MaxPool2d(2)]), (2, 16, 9, 11), (1, 4, 8)),
    ("avg2d_1x4", lambda: ConvPool(nn.Conv2d(16, 8, 3), [nn.AvgPool2d((1, 4))], pre=None), (1, 16, 7, 13), (1, 2, 8)),
    ("max2d_twice", lambda: ConvPool(nn.Conv2d(32, 16, 1), [nn.MaxPool2d(2), nn.MaxPool2d(2)], post=False),
     (1, 32, 9, 8), (1, 4, 4)),
    ("avg3d", lambda: ConvPool(nn.Conv3d(16, 16, 3, padding=1), [nn.AvgPool3d(2)]), (1, 16, 5, 6, 7), (2, 2, 4)),
    ("max3d_1x2x2", lambda: ConvPool(nn.Conv3d(16, 16, 3), [nn.MaxPool3d((1, 2, 2))], pre=None), (2, 16, 4, 7, 9),
     (1, 4, 4)),
]


@pytest.mark.parametrize("name,make,shape,box", POOL_BOX_CASES, ids=[c[0] for c in POOL_BOX_CASES])
def test_conv_pool_box_configs(name, make, shape, box):
    """A pool-fused convolution with a box config reads its input through tensor descriptors and
    pools each box's whole windows in the kernel (w, h and d axes in turn): the same pooled result
    as the graph, for NCHW and channels-last inputs; the box configs the space offers hold whole
    windows, and a box that cuts a window is refused."""
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape)
    g = rewrite(capture(from_module(model, [x])), "tf32")[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.pools]
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups, pair.pools, pair.post)
    out = fused.box_out(g, "tf32")
    assert out is not None and all(o % k == 0 for o, k in zip(out, fused.box_window))
    window = fused.box_window
    space = conv_space(M=fused.gemm[0], N=fused.gemm[1], K=fused.gemm[2], precision="tf32", elem_bytes=4, spec=H200,
                       channels=shape[1], box_out=out, box_window=window)
    boxes = [tuple(c[k] for k in BOX_KEYS) for c in space if "BOX_W" in c]
    assert boxes and all(b % k == 0 for bx in boxes for b, k in zip(bx, window))
    tile = dict(TILE, BLOCK_M=math.prod(box), BOX_D=box[0], BOX_H=box[1], BOX_W=box[2])
    text, ins = conv_epilogue.render(fused, tile, "tf32", f"conv_pool_box_{name}")
    mod = load_module_from_source(text, f"conv_pool_box_{name}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        want = model(x)
        args = [env[v] for v in ins]
        assert mod.tma_box_ok(args[ins.index(fused.x)], 1, (1,) * (x.dim() - 2)) == "copy"
        torch.testing.assert_close(mod.launch(*args)[0], want, rtol=2e-2, atol=2e-2)
        nd = x.dim() - 2
        xcl = args[ins.index(fused.x)].permute(0, *range(2, nd + 2), 1).contiguous().permute(0, nd + 1, *range(1, nd + 1))
        args[ins.index(fused.x)] = xcl
        assert mod.tma_box_ok(xcl, 1, (1,) * nd) == "channels-last"
        torch.testing.assert_close(mod.launch(*args)[0], want, rtol=2e-2, atol=2e-2)
        text, _ = conv_epilogue.render(fused, dict(tile, SPLIT_K=2), "tf32", f"conv_pool_box_split_{name}")
        split = load_module_from_source(text, f"conv_pool_box_split_{name}", CACHE)  # (K split: pooled in the sum's launch)
        torch.testing.assert_close(split.launch(*args)[0], want, rtol=2e-2, atol=2e-2)
        cut = (1, 1, 16) if window[:2] != (1, 1) else (1, 8, 2)  # 16 pixels, a side shorter than the window's
        text, _ = conv_epilogue.render(fused, dict(tile, BLOCK_M=16, BOX_D=cut[0], BOX_H=cut[1], BOX_W=cut[2]),
                                       "tf32", f"conv_pool_cut_{name}")
        with pytest.raises(ValueError, match="whole pool windows"):
            load_module_from_source(text, f"conv_pool_cut_{name}", CACHE).launch(*args)


def test_channel_reduction_writes_one_value_per_pixel():
    """A group reducing over the channels (here a sum, then a pointwise op) runs across one tile
    holding every channel and writes [N, *spatial]; a tile narrower than the channels is refused."""

    class SumC(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 20, 3, dilation=2)

        def forward(self, x):
            return torch.sigmoid(torch.relu(self.conv(x)).sum(dim=1) * 0.1)

    torch.manual_seed(0)
    model, x = SumC().eval(), torch.randn(2, 3, 9, 8)
    g, plan, pair = _pair(model, x, "fp32")
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert fused.row_out and fused.whole_n
    text, ins = conv_epilogue.render(fused, dict(TILE, BLOCK_N=32), "fp32", "conv_sum_c")
    mod = load_module_from_source(text, "conv_sum_c", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        torch.testing.assert_close(res, model(x), rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="BLOCK_N"):
            mod._conv_launch(*[env[v] for v in ins], dilation=2, BLOCK_N=16)


@pytest.mark.parametrize("pool,word", [
    (lambda: nn.MaxPool2d(3, stride=2), "window equals their stride"),
    (lambda: nn.MaxPool2d(9), "at most 64"),
    (lambda: nn.MaxPool2d(2, ceil_mode=True), "floor mode"),
    (lambda: nn.AvgPool2d(2, padding=1), "unpadded"),
])
def test_pools_it_refuses(pool, word):
    model, x = ConvPool(nn.Conv2d(3, 4, 3), [pool()]).eval(), torch.randn(1, 3, 12, 12)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.pools]
    with pytest.raises(Unsupported, match=word):
        conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups, pair.pools, pair.post)


def test_transposed_conv_pool_is_refused():
    model, x = ConvPool(nn.ConvTranspose2d(3, 4, 4, stride=2, padding=1), [nn.MaxPool2d(2)]).eval(), torch.randn(1, 3, 5, 5)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.pools]
    assert "transposed" in conv_epilogue.fusable(g, g.node(pair.anchor), pair.group, pair.pools, pair.post)


class ConvBnRelu(nn.Module):
    def __init__(self, residual):
        super().__init__()
        self.conv, self.bn, self.residual = nn.Conv2d(4, 6, 3, padding=1, stride=1, groups=2), nn.BatchNorm2d(6), residual

    def forward(self, x):
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + x.repeat(1, 2, 1, 1)[:, :6]
        return torch.relu(y)


@pytest.mark.parametrize("residual", [False, True])
def test_cudnn_conv_relu_folds_the_batch_norm(residual):
    """conv + (split-off bias) + inference batch norm (+ residual) + ReLU matches the one-call
    cuDNN candidate; its module folds the batch norm from the live statistics on every call (here
    run through aten, as on a machine without cuDNN), also after they change."""
    from kernelwright.codegen import cudnn_epilogue

    torch.manual_seed(0)
    model, x = ConvBnRelu(residual), torch.randn(2, 4, 7, 7)
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    g, plan, pair = _pair(model, x, "fp32")
    chain = cudnn_epilogue.match(g, g.node(pair.anchor), pair.group.nodes, pair.group.outputs)
    assert not isinstance(chain, str), chain
    assert chain.bn is not None and (chain.residual is not None) == residual and chain.ops[-1] == "relu"
    text, ins = cudnn_epilogue.render(g, g.node(pair.anchor), chain, g.node(pair.anchor).args[0].name, "cudnn_relu")
    mod = load_module_from_source(text, f"cudnn_relu_{residual}", CACHE)
    for _ in range(2):
        with torch.no_grad():
            env = run_graph(g, model, [x], keep=True)
            (res,) = mod.launch(*[env[v] for v in ins])
            torch.testing.assert_close(res, model(x), rtol=1e-5, atol=1e-5)
        model.bn.running_var.mul_(3.0)  # the statistics change: the next call folds the new ones


def test_cudnn_conv_relu_refuses_other_epilogues():
    from kernelwright.codegen import cudnn_epilogue

    model, x = ConvAct(nn.Conv2d(3, 4, 3)).eval(), torch.randn(1, 3, 6, 6)
    g, plan, pair = _pair(model, x, "fp32")
    assert "ReLU" in cudnn_epilogue.match(g, g.node(pair.anchor), pair.group.nodes, pair.group.outputs)


def test_a_channel_softmax_after_a_grouped_conv_is_refused():
    """A tile holds one group's channels, so a reduction over all channels of a grouped conv is not
    an epilogue (the plain pair and the chain both say why)."""
    model = ConvPool(nn.Conv2d(4, 6, 3, groups=2), [nn.MaxPool2d(2)], pre="softmax", post=False).eval()
    x = torch.randn(1, 4, 8, 8)
    g = rewrite(capture(from_module(model, [x])), "fp32")[0]
    plan = plan_graph(g)
    reasons = [conv_epilogue.fusable(g, g.node(p.anchor), p.group, p.pools, p.post) for p in plan.pairs]
    assert reasons and all(r and "grouped" in r for r in reasons), reasons


@pytest.mark.parametrize("make,shape,policy,box", [
    (lambda: nn.Conv2d(16, 8, 3, padding=1), (2, 16, 6, 8), "tf32", (1, 6, 8)),  # the NCHW input, copied
    (lambda: nn.Conv2d(16, 8, 3, padding=1), (2, 16, 6, 8), "bf16", (1, 6, 8)),
    (lambda: nn.Conv3d(16, 8, 3), (1, 16, 4, 5, 8), "tf32", (2, 3, 6)),
    (lambda: nn.Conv2d(16, 8, 3, padding=1), (2, 16, 6, 8), "fp32", None),  # FMA dots: no descriptors
    (lambda: nn.Conv2d(8, 8, 3, padding=1), (2, 8, 6, 8), "tf32", None),  # under 16 channels: taps fold
    (lambda: nn.Conv2d(16, 8, 3, stride=2), (2, 16, 6, 8), "tf32", None),
    (lambda: nn.Conv2d(16, 8, 3, groups=2), (2, 16, 6, 8), "tf32", None),
    (lambda: nn.Conv2d(16, 8, 3), (2, 16, 6, 6), "tf32", (1, 4, 4)),  # (rows of any length: x is copied)
    # transposed convolutions: boxes of the largest phase
    # class's sub-grid, the output itself at stride 1 and the output / 2 at stride 2
    (lambda: nn.ConvTranspose2d(16, 8, 3), (2, 16, 6, 8), "tf32", (1, 8, 10)),
    (lambda: nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), (2, 16, 3, 4), "tf32", (1, 3, 4)),
    (lambda: nn.ConvTranspose2d(16, 8, 3, stride=2, groups=2), (2, 16, 3, 4), "tf32", None),
])
def test_box_out_where_the_descriptor_path_applies(make, shape, policy, box, monkeypatch):
    """ConvEpilogue.box_out: the output's (D, H, W) (a transposed convolution's: its largest phase
    class's sub-grid) where the template's tensor-descriptor path reads the input the fused kernel
    takes (stride 1 or transposed, one group, tf32 / bf16, >= 16 channels of 16-byte rows,
    channels-last or NCHW), else None; the fused kernel with a box config matches the graph."""
    torch.manual_seed(3)
    model = ConvAct(make()).eval()
    x = torch.randn(shape)
    g, plan, pair = _pair(model, x, policy)
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert fused.box_out(g, policy) == box
    if fused.transposed:
        monkeypatch.setattr(conv_epilogue, "TRANSPOSED_BOXES", False)
        assert fused.box_out(g, policy) is None  # the switch: gathers only
    if box is not None and box[0] == 1:
        cfg = dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8)
        text, ins = conv_epilogue.render(fused, cfg, policy, f"conv_box_{policy}_{len(shape)}")
        assert "BOX_W=8" in text
        mod = load_module_from_source(text, f"conv_box_{policy}_{len(shape)}", CACHE)
        with torch.no_grad():
            env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        tol = 2e-2 if policy == "bf16" else 1e-4
        torch.testing.assert_close(res.float(), env[pair.group.outputs[0]].float(), rtol=tol, atol=tol)


DEPTHWISE = [
    ("3x3_tiles", lambda: nn.Conv2d(8, 8, 3, padding=1, groups=8), (2, 8, 9, 7),
     {"BLOCK_M": 32, "BLOCK_N": 4, "BLOCK_W": 8, "num_warps": 1}),
    ("3x3_rows", lambda: nn.Conv2d(8, 8, 3, padding=1, groups=8), (2, 8, 9, 7),
     {"BLOCK_M": 8, "BLOCK_N": 4, "ROWS": 4, "num_warps": 1}),
    ("5x5_stride2_mult2", lambda: nn.Conv2d(4, 8, 5, stride=2, padding=2, groups=4, bias=False), (2, 4, 11, 9),
     {"BLOCK_M": 16, "BLOCK_N": 8, "num_warps": 1}),
]


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name, make, shape, config", DEPTHWISE, ids=[c[0] for c in DEPTHWISE])
def test_a_depthwise_convolution_runs_its_epilogue_in_the_direct_kernel(name, make, shape, config, policy):
    """A depthwise convolution's epilogue group (a per-channel scale, GELU, a residual broadcast
    over the batch, a clamp) runs in the direct depthwise kernel, pixel tiles and row-streaming
    alike, the result stored in the layout the plan gives it (channels-last under tf32 and bf16)
    and, under bf16, the input's cast absorbed (rounded as it is loaded)."""
    torch.manual_seed(3)
    conv = make()
    with torch.no_grad():
        oh, ow = conv(torch.zeros(shape)).shape[2:]
    model = ConvAct(conv, residual=torch.randn(1, conv.out_channels, oh, ow)).eval()
    x = torch.randn(shape)
    g, plan, pair = _pair(model, x, policy)
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert conv_epilogue.direct_depthwise(fused) is None
    direct = conv_epilogue.direct_space(fused, channels_last=False)
    assert direct[0].as_dict() == {"BLOCK_M": 256, "BLOCK_N": 4, "num_warps": 4}
    assert any(c.as_dict().get("ROWS") for c in direct) == (name != "5x5_stride2_mult2")
    first, second = conv_epilogue.direct_seeds(direct)
    assert first == direct[0] and bool(second.as_dict().get("ROWS")) == (name != "5x5_stride2_mult2")
    text, ins = conv_epilogue.render_direct(fused, config, f"dw_epi_{name}_{policy}")
    assert ("_rows_kernel[grid]" in text) == (name != "5x5_stride2_mult2") and "tl.dot" not in text
    mod = load_module_from_source(text, f"dw_epi_{name}_{policy}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
    (res,) = mod.launch(*[env[v] for v in ins])
    want = env[pair.group.outputs[0]]
    assert res.dtype == want.dtype and res.stride() == tuple(g.meta(pair.group.outputs[0]).stride)
    tol = 2e-2 if policy == "bf16" else 1e-5
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)
    if policy == "bf16":
        assert fused.cast_bf16 and g.is_input(fused.x) and "ROUND_X=True" in text


def test_the_direct_depthwise_kernel_refuses_what_the_implicit_gemm_template_keeps():
    """A dense convolution, a depthwise one fused with a pool, and one with no group are not the
    direct kernel's (each says why)."""
    x = torch.randn(2, 4, 8, 8)

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)

        def forward(self, x):
            return F.max_pool2d(torch.relu(self.conv(x)), 2)

    g = rewrite(capture(from_module(ConvAct(nn.Conv2d(4, 6, 3)).eval(), [x])), "fp32")[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv"]
    assert "depthwise" in conv_epilogue.direct_depthwise(conv_epilogue.build(g, g.node(pair.anchor), pair.group))
    g = rewrite(capture(from_module(Pooled().eval(), [x])), "fp32")[0]
    plan = plan_graph(g)
    (pair,) = [p for p in plan.pairs if p.kind == "conv" and p.pools]
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups, pair.pools, pair.post)
    assert "pools" in conv_epilogue.direct_depthwise(fused)
    conv = next(n for n in g.nodes if n.target == conv_epilogue.CONV)
    assert "no epilogue group" in conv_epilogue.direct_depthwise(conv_epilogue.build(g, conv, None))
    with pytest.raises(Unsupported):
        conv_epilogue.render_direct(conv_epilogue.build(g, conv, None), {"BLOCK_M": 16, "BLOCK_N": 4}, "dw_none")


@pytest.mark.parametrize("policy,config", [("fp32", {"BLOCK_M": 16, "BLOCK_N": 4, "BLOCK_W": 8, "num_warps": 1}),
                                           ("bf16", {"BLOCK_M": 8, "BLOCK_N": 8, "ROWS": 4, "num_warps": 1})])
def test_the_direct_depthwise_kernel_applies_the_input_prologue(policy, config):
    """An eval-mode batch norm and ReLU before a depthwise convolution are the direct kernel's
    prologue (padding after it), pixel tiles and row-streaming programs alike, with the epilogue."""
    torch.manual_seed(4)
    model, x = PreAct(nn.Conv2d(8, 8, 3, padding=1, groups=8)).eval(), torch.randn(2, 8, 7, 9)
    g, plan, pair = _pair(model, x, policy)
    fused = conv_epilogue.build(g, g.node(pair.anchor), pair.group, plan.groups)
    assert not fused.prologue.empty and conv_epilogue.direct_depthwise(fused) is None
    text, ins = conv_epilogue.render_direct(fused, config, f"dw_pro_{policy}")
    assert "_prologue(xv, " in text and "prologue_operands=(" in text
    mod = load_module_from_source(text, f"dw_pro_{policy}", CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
        want = model(x)
    tol = 2e-2 if policy == "bf16" else 1e-5
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)
