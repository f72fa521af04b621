"""A training batch norm, a layer norm or a group norm whose result goes on into a pool, split into
its statistics and a pointwise apply (plan/norm_split.py): the rewritten graph computes the output
and the running statistics eager computes (float64), the planner keeps the apply apart from the
statistics so the pool chain can take it, and norms that feed anything else stay one
normalization group."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan import norm_split, plan_graph
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


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_a_batch_norm_before_a_convolution_splits_and_its_apply_stays_apart(policy, monkeypatch):
    """A training batch norm whose result goes on (through a ReLU, a scaling and the policy's layout
    copy) into a convolution splits like one before a pool (here at any row length): exact, running
    statistics included, and the planner keeps the apply out of the statistics' group, so the
    convolution can take it as the prologue of its loads. Rows one kernel reads once stay whole."""

    class ConvBnConv(ConvBnPool):
        def __init__(self):
            super().__init__()
            self.conv2 = nn.Conv2d(5, 4, 3)

        def forward(self, x):
            return self.conv2(torch.relu(self.bn(self.conv(x))) * 0.5)

    torch.manual_seed(1)
    model = ConvBnConv().train()
    x = torch.randn(2, 3, 6, 7)
    _, notes = _rewritten(model, x, policy)
    assert not any("feeds a convolution" in n for n in notes)  # (rows of 84: one pass)
    monkeypatch.setattr(norm_split, "CONV_SPLIT_MIN_ROW", 0)
    graph, notes = _rewritten(model, x, policy)
    assert any("feeds a convolution" in n for n in notes), notes
    plan = plan_graph(graph)
    (stats,) = [g for g in plan.groups if g.kind == "reduction"]
    applies = [g for g in plan.groups if g.rdims is None and any(n.endswith("_centred") for n in g.nodes)]
    assert len(applies) == 1 and not set(applies[0].nodes) & set(stats.nodes)
    if policy == "fp32":
        reference = copy.deepcopy(model)
        with torch.no_grad():
            env = run_graph(graph, model, [x], keep=True)
            torch.testing.assert_close(env[graph.outputs[0]], reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["group", "instance"])
def test_only_batch_norms_split_before_a_convolution(kind, monkeypatch):
    """A group or instance norm's statistics vary over the batch: its apply could not be a
    convolution's prologue (per-channel operands only), so it stays one normalization group."""
    monkeypatch.setattr(norm_split, "CONV_SPLIT_MIN_ROW", 0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4) if kind == "group" else nn.InstanceNorm2d(4),
                         nn.ReLU(), nn.Conv2d(4, 4, 3))
    _, notes = _rewritten(conv.train(), torch.randn(2, 3, 8, 8))
    assert not any("feeds a convolution" in n for n in notes)


def test_a_batch_norm_that_feeds_no_pool_stays_one_group():
    graph, notes = _rewritten(ConvBnPool(then="sum").train(), torch.randn(2, 3, 6, 7))
    assert not any("pointwise apply" in n for n in notes)
    assert any(n.target == "aten._native_batch_norm_legit_functional.default" for n in graph.nodes)


class ConvNormPool(nn.Module):
    """conv -> (+ per-channel bias) -> (+ scalar) -> group or layer norm -> tanh -> pool."""

    def __init__(self, kind, affine=True, shift=True, bias=False, nd=2):
        super().__init__()
        self.conv = (nn.Conv2d if nd == 2 else nn.Conv3d)(3, 6, 3, padding=1, bias=False)
        self.bias = nn.Parameter(torch.randn(6, *[1] * nd)) if bias else None
        self.norm = nn.GroupNorm(3, 6, affine=affine) if kind == "group" else \
            nn.LayerNorm(7 if nd == 2 else 4, elementwise_affine=affine)
        self.s = nn.Parameter(torch.tensor(0.3))
        self.shift, self.nd = shift, nd
        with torch.no_grad():
            for p in self.norm.parameters():
                p.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.conv(x)
        if self.bias is not None:
            y = y + self.bias
        if self.shift:
            y = y + self.s
        y = torch.tanh(self.norm(y)) * 2
        return (F.max_pool2d if self.nd == 2 else F.avg_pool3d)(y, 2)


@pytest.mark.parametrize("kind", ["group", "layer"])
@pytest.mark.parametrize("affine,shift,bias,nd", [(True, True, False, 2), (False, False, True, 3),
                                                  (True, False, True, 2), (False, True, False, 3)])
def test_group_and_layer_norms_before_a_pool_split_exactly(kind, affine, shift, bias, nd):
    """Shifts constant over the normalized dims (a scalar; a per-channel bias before a layer norm
    over the last dim) are left out of the statistics; a per-channel bias before a group norm is
    added again by the statistics and by the apply; float64-exact either way."""
    torch.manual_seed(0)
    model = ConvNormPool(kind, affine, shift, bias, nd)
    x = torch.randn(2, 3, *([6, 7] if nd == 2 else [4, 6, 4]))
    graph, notes = _rewritten(model, x)
    (note,) = [n for n in notes if "statistics and a pointwise apply" in n]
    assert note.startswith(f"native_{kind}_norm: {kind} norm of")
    assert ("recomputed by each" in note) == (kind == "group" and bias)
    assert not any(n.target.startswith("aten.native_") for n in graph.nodes)
    model, x = model.double(), x.double()
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
        torch.testing.assert_close(env[graph.outputs[0]], model(x), rtol=1e-10, atol=1e-10)
    (chain,) = plan_graph(graph).chains  # the apply is the pool's prologue
    assert chain.pre is not None and any(n.endswith("_centred") for n in chain.pre.nodes)


def test_norms_that_cannot_split_stay_whole():
    """A layer norm over the channels (its statistics vary across a pool window's channel),
    a group norm whose result is also returned: one normalization group each."""
    class Over(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.ln, self.gn = nn.Conv2d(3, 4, 1), nn.LayerNorm([4, 6, 6]), nn.GroupNorm(2, 4)

        def forward(self, x):
            y = self.gn(self.conv(x))
            return F.max_pool2d(self.ln(self.conv(x)), 2), F.max_pool2d(y, 2), y

    graph, notes = _rewritten(Over(), torch.randn(2, 3, 6, 6))
    assert not any("pointwise apply" in n for n in notes)
    assert {n.target for n in graph.nodes} >= {"aten.native_layer_norm.default", "aten.native_group_norm.default"}


def test_a_batch_norm_before_a_1d_pool_splits_through_the_pools_unsqueeze():
    """A 1-D pool reads its input through an unsqueeze: the training batch norm before it splits
    all the same, and the pool chain (views included) takes the apply as its prologue."""
    model = nn.Sequential(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.MaxPool1d(2)).train()
    x = torch.randn(2, 3, 11)
    graph, notes = _rewritten(model, x)
    assert any("statistics and a pointwise apply" in n for n in notes)
    (chain,) = plan_graph(graph).chains
    assert chain.into and chain.pre is not None and any(n.endswith("_centred") for n in chain.pre.nodes)
    model, x = model.double(), x.double()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
        torch.testing.assert_close(env[graph.outputs[0]], reference(x), rtol=1e-10, atol=1e-10)


def test_layer_norm_statistics_of_a_channels_last_convolution_keep_its_channels_innermost():
    """Under tf32 the convolution runs channels-last; the layer norm's statistics over its last dim
    are laid out with the channels innermost too (so the pool chain's per-element reads of them
    run along the channels as its reads of the convolution do), and the result is unchanged."""
    torch.manual_seed(0)
    model = ConvNormPool("layer", affine=True, shift=True, bias=False, nd=3)
    x = torch.randn(2, 3, 4, 6, 4)
    graph, _ = _rewritten(model, x, policy="tf32")
    conv = next(n for n in graph.nodes if n.target == "aten.convolution.default")
    assert conv.meta.stride[1] == 1  # (channels-last)
    mean = next(n for n in graph.nodes if n.name.endswith("_mean") and n.target == "aten.mean.dim")
    assert mean.meta.shape == (2, 6, 4, 6, 1) and mean.meta.stride == (144, 1, 36, 6, 6)
    model, x = model.double(), x.double()
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
        torch.testing.assert_close(env[graph.outputs[0]], model(x), rtol=1e-10, atol=1e-10)
