"""Exact rewrites: no-op removal keeps values, never touches outputs."""
import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.graph import Ref
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


class ReturnedCopies(nn.Module):
    """Copies at the end of a forward (dropout with p=0 at the end of a block exports as one)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        y = torch.relu(x) * 3
        z = x + 1
        return (y.clone(), z.clone(), z.view(6, 4), self.w.clone(), x.clone(), (x - 1).t().clone().t())


def test_a_returned_copy_of_a_computed_value_returns_the_value():
    x = torch.randn(4, 6)
    model = ReturnedCopies()
    g = capture(from_module(model, [x]))
    s, notes = simplify(g)
    kept = [s.node(o).target if not s.is_input(o) else "input" for o in s.outputs]
    # y's copy goes; z's stays (a view of z is returned too), as do the copies of the parameter and
    # the input and a copy into other strides
    assert kept[0] != "aten.clone.default" and sum("returned copy" in line for line in notes) == 1, (kept, notes)
    assert [k == "aten.clone.default" for k in kept[1:]] == [True, False, True, True, False]
    for a, b in zip(run_graph(s, model, [x]), run_graph(g, model, [x])):
        assert torch.equal(a, b)


def test_a_graph_without_noops_is_returned_as_is():
    g = capture(from_module(nn.ReLU(), [torch.randn(3)]))
    s, removed = simplify(g)
    assert s is g and removed == []


# --- row rewrites -----------------------------------------------------------------------------

import torch.nn.functional as F  # noqa: E402

from kernelwright.plan import plan_graph  # noqa: E402
from kernelwright.plan.rewrites import rewrite  # noqa: E402


class KL(nn.Module):
    def forward(self, a, b):
        return F.kl_div(F.log_softmax(a, -1), F.softmax(b, -1), reduction="batchmean")


class CE(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits, target)


def _close(g, s, model, inputs):
    for a, b in zip(run_graph(g, model, inputs), run_graph(s, model, inputs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_full_sum_after_a_row_op_is_taken_per_row_inside_the_row_group():
    x, y = torch.randn(5, 33), torch.randn(5, 33)
    g = capture(from_module(KL(), [x, y]))
    s, notes = rewrite(g)
    assert any("per row first" in n for n in notes)
    _close(g, s, KL(), [x, y])
    plan = plan_graph(s)
    row = [grp for grp in plan.groups if grp.rdims == (1,)]
    assert len(row) == 1 and any(s.node(n).target == "aten.sum.dim_IntList" for n in row[0].nodes)
    assert all(len(s.meta(o).shape) < 2 for o in row[0].outputs)  # nothing domain-sized is written
    assert not any(n.target == "aten.scalar_tensor.default" for n in s.nodes)  # constants folded


def test_a_plain_full_sum_is_left_alone():
    class MSE(nn.Module):
        def forward(self, a, b):
            return ((a - b) ** 2).mean()
    g = capture(from_module(MSE(), [torch.randn(4, 8), torch.randn(4, 8)]))
    s, notes = rewrite(g)
    assert not any("per row first" in n for n in notes)


def test_gather_from_log_softmax_becomes_input_minus_logsumexp():
    x, t = torch.randn(6, 17), torch.randint(0, 17, (6,))
    g = capture(from_module(CE(), [x, t]))
    s, notes = rewrite(g)
    assert any("logsumexp" in n for n in notes)
    assert not any(n.target == "aten._log_softmax.default" for n in s.nodes)
    _close(g, s, CE(), [x, t])
    # the row statistics and the picked logit meet in one row group over the logits
    plan = plan_graph(s)
    grp = [p for p in plan.groups if p.domain == (6, 17)]
    assert len(grp) == 1 and {"aten.amax.default", "aten.sum.dim_IntList"} <= {s.node(n).target for n in grp[0].nodes}


def test_log_softmax_read_elsewhere_is_kept():
    class Both(nn.Module):
        def forward(self, x, t):
            ls = F.log_softmax(x, -1)
            return ls.gather(1, t[:, None]), ls
    x, t = torch.randn(3, 9), torch.randint(0, 9, (3,))
    g = capture(from_module(Both(), [x, t]))
    s, notes = rewrite(g)
    assert not any("logsumexp" in n for n in notes)
    assert any(n.target == "aten._log_softmax.default" for n in s.nodes)


# --- channels-last convolutions (tf32 / bf16 policies) -----------------------------------------

from kernelwright.capture.shapes import channels_last_strides, contiguous_strides  # noqa: E402


class ConvAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8).eval()

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x))) * 2.0
        return F.max_pool2d(y, 2) + 1.0


def test_tf32_runs_dense_convs_channels_last_and_keeps_the_layout_downstream():
    model, x = ConvAct().eval(), torch.randn(2, 3, 8, 8)
    g = capture(from_module(model, [x]))
    conv32 = next(n for n in rewrite(g, "fp32")[0].nodes if n.target == "aten.convolution.default")
    assert conv32.meta.stride == g.node("convolution").meta.stride
    s, notes = rewrite(g, "tf32")
    conv = next(n for n in s.nodes if n.target == "aten.convolution.default")
    assert all(s.node(a.name).target == "aten.clone.default" for a in conv.args[:2])
    assert conv.meta.stride == channels_last_strides(conv.meta.shape)
    relu = next(n for n in s.nodes if n.target == "aten.relu.default")
    assert relu.meta.stride == channels_last_strides(relu.meta.shape)
    out = s.node(s.outputs[0])  # what the model returns keeps eager's (contiguous) layout
    assert out.meta.stride == g.node(g.outputs[0]).meta.stride
    with torch.no_grad():
        ref, out = run_graph(g, model, [x]), run_graph(s, model, [x])
        env = run_graph(s, model, [x], keep=True)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
    # what the library really produces agrees with the recorded layout
    assert env[conv.name].stride() == conv.meta.stride
    assert env[relu.name].stride() == relu.meta.stride


class PoolBranch(nn.Module):
    """An Inception module's pool branch beside a convolution of the same input (pool first in the
    forward, so the channels-last copy is made at the pool), both joined along the channels."""

    def __init__(self, pool):
        super().__init__()
        self.pool, self.proj, self.conv = pool, nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return torch.cat([self.proj(self.pool(x)), self.conv(x)], 1)


@pytest.mark.parametrize("pool", [nn.MaxPool2d(3, 1, 1), nn.AvgPool2d(3, 1, 1)], ids=["max", "avg"])
def test_a_pool_of_a_value_convolutions_copy_channels_last_reads_that_copy(pool):
    """The pool reads the convolutions' channels-last copy of x and pools into channels-last: the
    convolution after it reads its result without a copy of its own; values unchanged."""
    model, x = PoolBranch(pool).eval(), torch.randn(2, 8, 6, 5)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    p = next(n for n in s.nodes if n.target in ("aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default"))
    copy = s.node(p.args[0].name)
    assert copy.target == "aten.clone.default" and copy.args[0].name == "x"
    assert p.meta.stride == channels_last_strides(p.meta.shape)
    convs = [n for n in s.nodes if n.target == "aten.convolution.default"]
    assert convs[1].args[0].name == copy.name  # one copy of x, read by the pool and the other convolution
    assert [n for n in s.nodes if n.target == "aten.clone.default" and n.args[0].name == "x"] == [copy]
    assert not s.node(convs[0].args[0].name).target == "aten.clone.default"  # the pooled value is read as it is
    assert any("channels-last copy" in n for n in notes)
    _close(g, s, model, [x])
    assert rewrite(g, "fp32")[0].node(p.name).args[0].name == "x"  # (fp32: no channels-last copies)


def test_a_pool_of_a_value_no_convolution_copies_keeps_its_input():
    model = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(8, 4, 1))
    s, notes = rewrite(capture(from_module(model.eval(), [torch.randn(1, 8, 5, 5)])), "tf32")
    p = next(n for n in s.nodes if n.target == "aten.max_pool2d_with_indices.default")
    assert s.is_input(p.args[0].name) and not any("channels-last copy" in n for n in notes)


def test_depthwise_convs_stay_in_their_layout():
    conv = nn.Conv2d(4, 4, 3, groups=4)
    g = capture(from_module(conv, [torch.randn(1, 4, 6, 6)]))
    s, notes = rewrite(g, "tf32")
    assert not any("channels-last" in n for n in notes)


def test_convs_feeding_a_norm_run_channels_last_and_the_returned_value_keeps_eagers_layout():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Tanh())
    x = torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    assert any("channels-last" in n for n in notes)
    norm = next(n for n in s.nodes if n.target == "aten.native_group_norm.default")
    assert s.meta(norm.args[0].name).stride == channels_last_strides(norm.meta.shape)
    assert s.node(s.outputs[0]).meta.stride == g.node(g.outputs[0]).meta.stride
    _close(g, s, model, [x])


def test_planned_layouts_give_each_value_the_layout_its_metadata_names():
    """Under tf32 the plan keeps a group norm's result channels-last, but aten.native_group_norm
    returns it contiguous: the tuning environment (run_graph with planned_layouts) holds each value
    in its planned layout, with the same values; expanded and gapped tensors stay as they are."""
    from kernelwright.capture.execute import in_planned_layout
    from kernelwright.capture.graph import TensorMeta

    class Model(nn.Module):  # (the norm's result is read twice: it stays one normalization, not split)
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8)

        def forward(self, x):
            y = torch.tanh(self.norm(self.conv(x)))
            return F.avg_pool2d(y, 2), y.amax()

    model = Model()
    x = torch.randn(2, 3, 9, 9)
    s, _ = rewrite(capture(from_module(model, [x])), "tf32")
    plain = run_graph(s, model, [x], keep=True)
    natural: dict = {}
    planned = run_graph(s, model, [x], keep=True, planned_layouts=True, natural=natural)
    moved = set()
    for n in s.nodes:
        a, b = plain[n.name], planned[n.name]
        if not isinstance(a, torch.Tensor):
            continue
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        assert all(sh == 1 or st == ms for sh, st, ms in zip(b.shape, b.stride(), n.meta.stride)), n.name
        if a.stride() != b.stride():
            moved.add(n.name)
    assert moved  # the norm's result, which the library returns contiguous
    # the library's own result of each value moved (the norm's, the returned pool's), for the units
    # the library computes after all: the same values in the layout the library gave them
    assert natural and "getitem" in natural
    for v, lib in natural.items():
        assert torch.equal(lib, planned[v]) and lib.stride() != planned[v].stride()
    kept: dict = {}
    run_graph(s, model, [x], keep={s.outputs[0]}, planned_layouts=True, natural=kept)
    assert set(kept) <= {s.outputs[0]}  # values let go are not held as their library copies either
    wide = torch.randn(4, 1).expand(4, 6)
    assert in_planned_layout(wide, TensorMeta.dense((4, 6), "float32")) is wide  # expanded: left alone
    t = torch.randn(6, 4).t()
    assert in_planned_layout(t, TensorMeta((4, 6), (1, 4), "float32")) is t  # already so
    c = in_planned_layout(t, TensorMeta.dense((4, 6), "float32"))
    assert c.is_contiguous() and torch.equal(c, t)


class ConvViews(nn.Module):
    """A [N, C, H, W] value viewed as [1, N * C, H, W] (no view of the channels-last tensor has that
    shape); flattening H and W is a view in both layouts. With `pool`, the merged view reads a max
    pool of the conv's result, else the result itself."""

    def __init__(self, pool=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x):
        y = torch.relu(self.conv(x))
        p = self.pool(y)
        return p.reshape(1, -1, *p.shape[2:]).amax(dim=1) / 2.0, y.view(2, 8, -1).sum(-1)


def test_a_conv_whose_result_is_viewed_as_nchw_stays_nchw():
    """A [1, N * C, H, W] view of the conv's (elementwise) result: the conv keeps eager's layout
    rather than writing channels-last and copying the whole result back."""
    model, x = ConvViews(), torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    conv = next(n for n in s.nodes if n.target == "aten.convolution.default")
    assert conv.meta.stride == contiguous_strides(conv.meta.shape) and conv.args[0].name == "x"
    assert any("kept NCHW" in n for n in notes)
    assert not any(n.target == "aten.clone.default" for n in s.nodes)
    _close(g, s, model, [x])


def test_views_of_a_channels_last_pooled_value_get_its_strides_or_a_copy_back():
    model, x = ConvViews(pool=True), torch.randn(2, 3, 9, 9)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    relu = next(n for n in s.nodes if n.target == "aten.relu.default")
    assert relu.meta.stride == channels_last_strides(relu.meta.shape)
    pooled = next(n for n in s.nodes if n.target == "getitem" and s.node(n.args[0].name).target.startswith("aten.max_pool"))
    merged = next(v for v in s.nodes if v.target == "aten.view.default" and v.meta.shape == (1, 16, 3, 3))
    back = s.node(merged.args[0].name)  # the merged view reads a contiguous copy of the pooled value
    assert back.target == "aten.clone.default" and back.args[0].name == pooled.name
    assert back.meta.stride == (72, 9, 3, 1) and any("copied back to the contiguous layout" in n for n in notes)
    flat = next(v for v in s.nodes if v.target == "aten.view.default" and v.meta.shape == (2, 8, 49))
    assert flat.args[0].name == relu.name and flat.meta.stride == (392, 1, 8)  # a view of the channels-last tensor
    assert any("convolution run channels-last" in n for n in notes)
    with torch.no_grad():
        ref, env = run_graph(g, model, [x]), run_graph(s, model, [x], keep=True)
    for a, b in zip(ref, [env[o] for o in s.outputs]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert env[flat.name].stride() == flat.meta.stride and env[back.name].stride() == back.meta.stride


def test_conv_bias_is_split_off_where_the_add_fuses_with_the_consumer():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    x = torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g)
    conv = next(n for n in s.nodes if n.target == "aten.convolution.default")
    assert conv.args[2] is None and any("bias" in n for n in notes)
    plan = plan_graph(s)
    grp = next(p for p in plan.groups if "relu" in p.nodes)
    assert any(s.node(n).target == "aten.add.Tensor" for n in grp.nodes)  # the bias add joins the relu
    _close(g, s, model, [x])


def test_conv_bias_stays_for_depthwise_convs_only():
    g = capture(from_module(nn.Sequential(nn.Conv2d(4, 4, 3, groups=4), nn.ReLU()), [torch.randn(1, 4, 6, 6)]))
    assert not any("bias" in n for n in rewrite(g)[1])
    for model in (nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8)), nn.Conv2d(4, 8, 3),
                  nn.Sequential(nn.Conv2d(4, 8, 3), nn.MaxPool2d(2))):
        x = torch.randn(2, 4, 6, 6)
        g = capture(from_module(model, [x]))
        s, notes = rewrite(g)
        assert any("bias" in n for n in notes), model
        assert all(n.args[2] is None for n in s.nodes if n.target == "aten.convolution.default")
        _close(g, s, model, [x])


class _Bf16Biases(nn.Module):
    """An autocast graph's convolution and Linear: bf16 operands and bias, a bf16 result."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(16, 5)

    def forward(self, x):
        bf = torch.bfloat16
        c = self.conv
        y = torch.relu(F.conv2d(x.to(bf), c.weight.to(bf), c.bias.to(bf)))
        return torch.sigmoid(F.linear(y.flatten(1), self.fc.weight.to(bf), self.fc.bias.to(bf)))


def test_a_bf16_convolution_or_linear_keeps_its_bias():
    """Split off a bf16 result, the bias would be added to the product after it was rounded to bf16,
    a second rounding the library (cuBLAS's bias epilogue, the CPU's convolution) does not make:
    both keep their bias; the float32 ones of the same model are split."""
    model, x = _Bf16Biases(), torch.randn(2, 3, 4, 4)
    s, notes = rewrite(capture(from_module(model, [x])))
    assert not any("bias" in n for n in notes), notes
    assert any(n.target == "aten.addmm.default" for n in s.nodes)
    assert all(n.args[2] is not None for n in s.nodes if n.target == "aten.convolution.default")
    full = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 5), nn.Sigmoid())
    notes = rewrite(capture(from_module(full, [x])))[1]
    assert sum("bias" in n or "plain GEMM" in n for n in notes) == 2, notes


def test_a_returned_conv_split_under_tf32_is_written_in_eagers_layout():
    model = nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    conv = next(n for n in s.nodes if n.target == "aten.convolution.default")
    assert conv.meta.stride == channels_last_strides(conv.meta.shape) and conv.args[2] is None
    out = s.node(s.outputs[0])
    assert out.target == "aten.add.Tensor" and out.meta.stride == g.node(g.outputs[0]).meta.stride
    _close(g, s, model, [x])


def test_a_training_batch_norm_after_a_conv_reads_channels_last_in_memory_order():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).train()
    x = torch.randn(2, 3, 6, 6)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    assert any("bias" in n for n in notes) and any("channels-last" in n for n in notes)
    plan = plan_graph(s)
    grp = next(p for p in plan.groups if p.rdims is not None)
    assert any(s.node(n).target == "aten.add.Tensor" for n in grp.nodes)  # the bias add fuses into the norm


def test_repeated_subexpressions_are_merged_but_random_ops_are_not():
    class Rep(nn.Module):
        def forward(self, x, t):
            a = (t != 3).float().sum()
            b = (t != 3).float().sum()
            return torch.sigmoid(x) * torch.sigmoid(x) + a - b, torch.rand_like(x) + torch.rand_like(x)

    x, t = torch.randn(4, 5), torch.randint(0, 6, (4,))
    g = capture(from_module(Rep(), [x, t]))
    s, notes = rewrite(g)
    assert sum("same as" in n for n in notes) >= 3  # ne, the cast, the sum, the sigmoid
    assert sum(n.target == "aten.sigmoid.default" for n in s.nodes) == 1
    assert sum("rand" in n.target for n in s.nodes) == sum("rand" in n.target for n in g.nodes) == 2
    torch.testing.assert_close(run_graph(s, Rep(), [x, t])[0], run_graph(g, Rep(), [x, t])[0])


def test_max_pool_moves_before_bias_add_and_relu():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Hardswish())
    x = torch.randn(2, 3, 9, 9)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g)
    assert any("max pool moved before add -> relu" in n for n in notes), notes
    pool = next(n for n in s.nodes if n.target == "aten.max_pool2d_with_indices.default")
    assert s.node(pool.args[0].name).target == "aten.convolution.default"  # reads the raw conv
    relu = next(n for n in s.nodes if n.target == "aten.relu.default")
    assert relu.meta.shape == pool.meta.shape  # the bias add and relu run on the pooled tensor
    _close(g, s, model, [x])
    # one kernel after the pool: bias add, relu and hardswish
    plan = plan_graph(s)
    assert any({"aten.add.Tensor", "aten.relu.default"} <= {s.node(n).target for n in grp.nodes} for grp in plan.groups)


def test_max_pool_stays_after_non_monotone_ops_or_when_indices_are_read():
    class Idx(nn.Module):
        def forward(self, x):
            v, i = F.max_pool2d(torch.relu(x), 2, return_indices=True)
            return v, i

    for model in (nn.Sequential(nn.GELU(), nn.MaxPool2d(2)), nn.Sequential(nn.Tanh(), nn.MaxPool2d(2)), Idx()):
        x = torch.randn(2, 3, 8, 8)
        g = capture(from_module(model, [x]))
        _, notes = rewrite(g)
        assert not any("max pool moved" in n for n in notes), model


def test_max_pool_does_not_move_past_an_operand_that_varies_in_the_window():
    class Mix(nn.Module):
        def forward(self, x, y):
            return F.max_pool2d(x + y, 2)  # y varies over H, W: max(x + y) != max(x) + y

    x, y = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    g = capture(from_module(Mix(), [x, y]))
    assert not any("max pool moved" in n for n in rewrite(g)[1])


def test_max_pool_first_is_exact_with_padding_and_negative_windows():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LeakyReLU(0.2), nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True))
    x = torch.randn(2, 3, 12, 11, generator=torch.Generator().manual_seed(0)) - 3.0
    g = capture(from_module(model, [x]))  # mostly negative: padding must not leak a 0 into the max
    s, notes = rewrite(g)
    assert any("max pool moved" in n for n in notes)
    with torch.no_grad():
        # the pool is exact; the convolution's bias, added after the pool (split_conv_bias), may
        # round differently from oneDNN's fused bias (2.7e-7 seen with torch 2.13 on the CPU)
        torch.testing.assert_close(run_graph(g, model, [x])[0], run_graph(s, model, [x])[0], rtol=1e-6, atol=1e-6)


def test_linear_bias_moves_into_the_epilogue_only_when_the_result_is_consumed_by_a_fusible_op():
    model = nn.Sequential(nn.Linear(12, 10), nn.Sigmoid())
    x = torch.randn(4, 12)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g)
    assert any("plain GEMM" in n for n in notes), notes
    assert not any(n.target == "aten.addmm.default" for n in s.nodes)
    assert any(n.target == "aten.mm.default" for n in s.nodes)
    plan = plan_graph(s)
    assert any({"aten.add.Tensor", "aten.sigmoid.default"} <= {s.node(n).target for n in grp.nodes} for grp in plan.groups)
    _close(g, s, model, [x])
    bare = nn.Linear(12, 10)
    g = capture(from_module(bare, [x]))
    assert not any("plain GEMM" in n for n in rewrite(g)[1])  # cuBLAS's bias epilogue is free


def test_library_group_norm_gets_an_nchw_input_as_cuda_requires(monkeypatch):
    """PyTorch's CUDA group norm refuses channels-last inputs (the CPU one accepts them): the
    library call, in the executor and in emitted code, is given a contiguous copy."""
    import kernelwright.capture.execute as ex
    from kernelwright.emit.program import node_line

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.Tanh())
    x = torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, _ = rewrite(g, "tf32")
    norm = next(n for n in s.nodes if n.target == "aten.native_group_norm.default")
    assert ".contiguous()" in node_line(s, norm.name)
    real = ex.resolve

    def strict(target):
        fn = real(target)
        if target != "aten.native_group_norm.default":
            return fn

        def check(x, *args):
            assert x.is_contiguous(), "CUDA group norm needs NCHW"
            return fn(x, *args)
        return check

    monkeypatch.setattr(ex, "resolve", strict)
    _close(g, s, model, [x])


# --- the bf16 policy ---------------------------------------------------------------------------

def test_bf16_gemm_reads_bf16_operands_and_returns_float32():
    from kernelwright.plan.rewrites import bf16_operands

    model = nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 5))
    x = torch.randn(4, 16)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "bf16")
    gemms = [n for n in s.nodes if n.target in ("aten.mm.default", "aten.addmm.default")]
    assert len(gemms) == 2 and all(n.meta.dtype == "bfloat16" for n in gemms)
    assert all(s.meta(a.name).dtype == "bfloat16" for n in gemms for a in n.args if isinstance(a, Ref))
    assert sum("bf16 operands" in n for n in notes) == 2
    assert s.node(s.outputs[0]).meta.dtype == "float32"
    with torch.no_grad():
        got = run_graph(s, model, [x])[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = model(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, auto.float(), rtol=2e-2, atol=2e-2)  # autocast's rounding, within bf16
    assert bf16_operands(s)[1] == []  # idempotent: nothing float32 is left to narrow


def test_bf16_conv_operands_are_cast_and_made_channels_last_in_one_copy():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    x = torch.randn(2, 3, 7, 7)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "bf16")
    conv = next(n for n in s.nodes if n.target == "aten.convolution.default")
    for a in conv.args[:2]:
        src = s.node(a.name)
        assert src.target == "aten._to_copy.default" and src.kwargs["dtype"] == torch.bfloat16
        assert src.kwargs["memory_format"] == torch.channels_last and s.meta(src.args[0].name).dtype == "float32"
    assert not any(n.target == "aten.clone.default" for n in s.nodes)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(s, model, [x])[0], model(x), rtol=3e-2, atol=3e-2)


def test_bf16_max_pool_reads_the_bf16_conv_result_and_widens_after():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
    x = torch.randn(2, 3, 8, 8)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "bf16")
    pool = next(n for n in s.nodes if n.target == "aten.max_pool2d_with_indices.default")
    assert s.meta(pool.args[0].name).dtype == "bfloat16" and pool.outs[0].dtype == "bfloat16"
    pooled = " ".join(n for n in notes if "max pool moved" in n)
    assert "add -> relu" in pooled and "before _to_copy" in pooled, notes  # bias, relu, then the widening, after the pool
    out = s.node(s.outputs[0])
    assert out.meta.dtype == "float32" and out.meta.shape == (2, 8, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(s, model, [x])[0], model(x), rtol=3e-2, atol=3e-2)


def test_bf16_outputs_follow_eager_under_autocast():
    """With eager's autocast output dtypes, outputs eager returns as bf16 are returned as bf16 (one
    rounding at the end); a widened bf16 result is returned as it is; float32 outputs stay."""
    from kernelwright.pipeline import baseline_output_dtypes
    from kernelwright.policy import get_policy

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.conv = nn.Linear(16, 12), nn.Conv2d(3, 4, 3, bias=False)

        def forward(self, x, y):
            return torch.relu(self.lin(x)), torch.softmax(self.lin(x), -1), self.conv(y)

    model, x, y = Two(), torch.randn(4, 16), torch.randn(2, 3, 6, 6)
    p = from_module(model, [x, y])
    dtypes = baseline_output_dtypes(p, get_policy("bf16"), torch.device("cpu"))
    assert dtypes[0] == dtypes[2] == torch.bfloat16
    assert baseline_output_dtypes(p, get_policy("fp32"), torch.device("cpu")) is None
    s, notes = rewrite(capture(p), "bf16", dtypes)
    assert [s.meta(o).dtype for o in s.outputs] == [str(d).replace("torch.", "") for d in dtypes]
    assert s.node(s.outputs[2]).target == "aten.convolution.default"  # the bf16 conv result itself
    widen = [n for n in s.nodes if n.inputs == [s.outputs[2]]]
    assert widen == []  # its float32 widening, read by nothing now, is gone
    with torch.no_grad():
        got = run_graph(s, model, [x, y])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = model(x, y)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)


# --- inference batch norm folded into the convolution or Linear before it ----------------------

from kernelwright.plan.rewrites import fold_eval_batch_norm  # noqa: E402


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearBN(nn.Module):
    def __init__(self, k=5, bias=True):
        super().__init__()
        self.lin, self.bn = nn.Linear(k, 7, bias=bias), nn.BatchNorm1d(7)

    def forward(self, x):
        return self.bn(self.lin(x))


def _eval_with_statistics(model):
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            if m.affine:
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-1, 1)
    return model.eval()


class LinearBNAffine(LinearBN):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(7, affine=False)


@pytest.mark.parametrize("model,x", [
    (LinearBN(), torch.randn(9, 5)),
    (LinearBN(bias=False), torch.randn(9, 5)),
    (LinearBNAffine(), torch.randn(9, 5)),
])
def test_inference_batch_norm_is_folded_into_the_linear_before_it(model, x):
    model = _eval_with_statistics(model)
    g = capture(from_module(model, [x]))
    f, notes = fold_eval_batch_norm(g)
    assert notes and "folded" in notes[0]
    assert not any("batch_norm" in n.target for n in f.nodes)
    producers = [n for n in f.nodes if n.target == "aten.addmm.default"]
    assert len(producers) == 1 and producers[0].args[0].name not in {i.name for i in f.inputs}  # the folded bias
    torch.testing.assert_close(run_graph(f, model, [x])[0], model(x), rtol=1e-5, atol=1e-5)
    # the folded weights are recomputed from the live parameters: an in-place edit is seen
    model.bn.running_var.data.mul_(3)
    torch.testing.assert_close(run_graph(f, model, [x])[0], model(x), rtol=1e-5, atol=1e-5)


class LinearBNReLU(LinearBN):
    def forward(self, x):
        return torch.relu(super().forward(x))


@pytest.mark.parametrize("model,x,why", [
    (LinearBN().train(), torch.randn(9, 5), "training mode: batch statistics"),
    (ConvBN(), torch.randn(2, 3, 8, 8), "a convolution's bias is a pass of its own: the batch norm is free there"),
    (LinearBNReLU(), torch.randn(9, 5), "the batch norm fuses into the ReLU's kernel"),
    (LinearBN(k=64), torch.randn(9, 64), "the weight is larger than the output"),
])
def test_batch_norm_is_not_folded(model, x, why):
    model = model if model.training else _eval_with_statistics(model)
    g = capture(from_module(model, [x]))
    f, notes = fold_eval_batch_norm(g)
    assert f is g and notes == [], why


class LinearBNTap(LinearBN):
    def forward(self, x):
        y = self.lin(x)
        return self.bn(y), y.sum(0)


def test_batch_norm_is_not_folded_when_the_linear_is_read_elsewhere():
    model = _eval_with_statistics(LinearBNTap())
    g = capture(from_module(model, [torch.randn(9, 5)]))
    assert fold_eval_batch_norm(g) == (g, [])


class ConvThenLibrary(nn.Module):
    """Library ops after a channels-last conv, then a flatten: an adaptive average pool (which keeps
    its input's layout) and a padding (an op the layout rules do not cover)."""

    def __init__(self, op):
        super().__init__()
        self.conv, self.op = nn.Conv2d(3, 8, 3), op

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.op == "adaptive":
            y = F.adaptive_avg_pool2d(y, (3, 3))
        else:
            y = F.pad(y, (1, 1, 1, 1))
        return torch.flatten(y, 1).sum(-1)


@pytest.mark.parametrize("op", ["adaptive", "pad"])
def test_a_flatten_after_a_library_op_on_a_channels_last_value_runs(op):
    """The view reads a channels-last result (adaptive pools keep the layout) or a value whose layout
    the library picks through a contiguous copy, so ATen's view accepts it."""
    model, x = ConvThenLibrary(op), torch.randn(2, 3, 8, 8)
    g = capture(from_module(model, [x]))
    s, notes = rewrite(g, "tf32")
    assert any("convolution run channels-last" in n for n in notes)
    assert any("copied" in n and "contiguous layout" in n for n in notes)
    _close(g, s, model, [x])


def test_a_cast_naming_its_layout_and_device_joins_the_elementwise_group_after_it():
    """AOTAutograd writes a gradient's widening as `_to_copy(x, dtype, layout, device)`: it becomes
    a cast of its dtype alone, which plans as elementwise work (not a library copy) and computes
    the same values."""
    from kernelwright.plan.rewrites import dtype_only_casts

    class Cast(nn.Module):
        def forward(self, x):
            return torch.ops.aten._to_copy.default(torch.relu(x), dtype=torch.float32, layout=torch.strided,
                                                   device=x.device) * 2.0

    model, x = Cast(), torch.randn(4, 6).to(torch.bfloat16)
    g = capture(from_module(model, [x]))
    (cast,) = [n for n in g.nodes if n.target == "aten._to_copy.default"]
    assert {"layout", "device"} <= set(cast.kwargs)
    new, notes = dtype_only_casts(g)
    (cast,) = [n for n in new.nodes if n.target == "aten._to_copy.default"]
    assert cast.kwargs == {"dtype": torch.float32} and not notes
    plan = plan_graph(rewrite(g, "fp32")[0])
    (group,) = plan.groups
    assert cast.name in group.nodes and not [u for u in plan.units if u.group is None]
    with torch.no_grad():
        torch.testing.assert_close(run_graph(new, model, [x])[0], model(x))
