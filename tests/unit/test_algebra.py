"""The exact algebra rules (plan/algebra.py): every rule against the original graph in float64 on
random inputs and on its docstring's edge cases (NaN, infinities, signed zeros, magnitudes that
over- or underflow when squared), after weight edits, on random programs built from the fuzzer's
zoo of steps; FLOPs and bytes of the shipped problems it applies to; --no-rewrites; the analysis
fields and the report lines."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.analyze.cost import graph_cost
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.capture.graph import Ref
from kernelwright.fuzz import generate as gen
from kernelwright.fuzz.steps import OPS, Invalid
from kernelwright.plan.algebra import RULES, algebra, parse_note
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module, load_problem

ROOT = Path(__file__).resolve().parents[2]
INF, NAN = math.inf, math.nan


def _captured(model: nn.Module, inputs: list):
    """The float64 model, its inputs and its captured graph."""
    model = model.double()
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    return model, inputs, capture(from_module(model, inputs))


def _layout(a: torch.Tensor) -> tuple:
    return tuple(a.shape), a.dtype, tuple(st for s, st in zip(a.shape, a.stride()) if s != 1)


def _metas_hold(graph, model, inputs) -> None:
    """Every value the graph computes has the shape, dtype and strides its meta says."""
    env = run_graph(graph, model, inputs, keep=True)
    for n in graph.nodes:
        value, m = env[n.name], n.meta
        if isinstance(value, torch.Tensor) and m is not None:
            assert _layout(value) == (m.shape, getattr(torch, m.dtype),
                                      tuple(st for s, st in zip(m.shape, m.stride) if s != 1)), n


def _same(g, r, model, inputs, exact: bool = False) -> None:
    """The rewritten graph `r` returns what `g` returns (bit for bit with `exact`, NaN where NaN),
    with the same shapes, dtypes and strides."""
    for want, got in zip(run_graph(g, model, inputs), run_graph(r, model, inputs)):
        assert _layout(got) == _layout(want)
        if exact:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        else:
            scale = float(want.detach()[torch.isfinite(want)].abs().max()) if torch.isfinite(want).any() else 1.0
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11 * (1 + scale), equal_nan=True)


def _rules(notes: list[str]) -> set[str]:
    return {p["rule"] for p in map(parse_note, notes) if p is not None}


def _edit_weights(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.5).add_(0.25)


def _check(model, inputs, rule: str, exact: bool = False):
    """Capture in float64, apply the rules, check `rule` fired and the graphs agree, before and
    after the weights are edited; returns the two graphs and the notes."""
    model, inputs, g = _captured(model, inputs)
    r, notes = algebra(g)
    assert rule in _rules(notes), notes
    _same(g, r, model, inputs, exact)
    _metas_hold(r, model, inputs)
    _edit_weights(model)
    _same(g, r, model, inputs, exact)
    return g, r, notes


class Fn(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


# --- size-1 dims ----------------------------------------------------------------------------------

EDGES = torch.tensor([INF, -INF, NAN, -0.0, 0.0, 1e30, -1e30, 1e-30, 3.0, -2.5])


def _edge_input(shape, dim: int):
    """Random values with the edge cases laid along one dim other than the size-1 `dim`."""
    x = torch.randn(shape, dtype=torch.float64)
    other = next(d for d in range(len(shape)) if d != dim and shape[d] >= 2)
    idx = [slice(None)] * len(shape)
    n = min(shape[other], len(EDGES))
    idx[other] = slice(0, n)
    view = x[tuple(idx)]
    view.copy_(EDGES[:n].double().view([-1 if d == other else 1 for d in range(len(shape))]).expand_as(view))
    return x


SIZE_ONE = [
    ("sum", lambda s, x: x.sum(dim=1), "size_one_reduction"),
    ("sum_keep", lambda s, x: x.sum(dim=(1, 3), keepdim=True) * 2, "size_one_reduction"),
    ("mean", lambda s, x: x.mean(dim=1), "size_one_reduction"),
    ("amax", lambda s, x: torch.amax(x, dim=1), "size_one_reduction"),
    ("amin", lambda s, x: torch.amin(x, dim=(1, 3), keepdim=True), "size_one_reduction"),
    ("prod", lambda s, x: x.prod(1), "size_one_reduction"),
    ("max", lambda s, x: torch.max(x, dim=1).values + 1, "size_one_max"),
    ("min", lambda s, x: torch.min(x, dim=1, keepdim=True)[0], "size_one_max"),
    ("softmax", lambda s, x: torch.softmax(x, dim=1), "size_one_softmax"),
    ("log_softmax", lambda s, x: F.log_softmax(x, dim=3), "size_one_softmax"),
    ("logsumexp", lambda s, x: torch.logsumexp(x, dim=1), "size_one_logsumexp"),
    ("logsumexp_keep", lambda s, x: torch.logsumexp(x, dim=(1, 3), keepdim=True), "size_one_logsumexp"),
    ("norm2", lambda s, x: torch.linalg.vector_norm(x, 2, dim=1), "size_one_norm"),
    ("norm1", lambda s, x: torch.linalg.vector_norm(x, 1, dim=(1, 3), keepdim=True), "size_one_norm"),
    ("norm_inf", lambda s, x: torch.linalg.vector_norm(x, INF, dim=1), "size_one_norm"),
    ("centred", lambda s, x: x - x.mean(dim=1, keepdim=True), "size_one_reduction"),
]


@pytest.mark.parametrize("name,fn,rule", SIZE_ONE, ids=[c[0] for c in SIZE_ONE])
def test_size_one_closed_forms_are_exact_for_every_input(name, fn, rule):
    x = _edge_input((3, 1, 10, 1), 1)
    model, inputs, g = _captured(Fn(fn), [x])
    r, notes = algebra(g)
    assert rule in _rules(notes), notes
    _same(g, r, model, [x], exact=True)
    _same(g, r, model, [torch.randn(3, 1, 10, 1, dtype=torch.float64)], exact=True)
    _metas_hold(r, model, [x])
    assert graph_cost(r).flops < graph_cost(g).flops


def test_size_one_reduction_of_a_returned_input_is_a_copy_not_a_view():
    model, inputs, g = _captured(Fn(lambda s, x: (x.sum(1), x.amax(1, keepdim=True))), [torch.randn(4, 1)])
    r, notes = algebra(g)
    assert len(notes) == 2
    outs = run_graph(r, model, inputs)
    assert all(o.data_ptr() != inputs[0].data_ptr() for o in outs)
    assert [r.node(o).target for o in r.outputs] == ["aten.clone.default"] * 2
    _same(g, r, model, inputs, exact=True)


def test_size_one_reduction_of_a_transposed_value_keeps_contiguous_strides():
    """sum over a size-1 dim of a transposed value is copied to the contiguous layout the reduction had."""
    model, inputs, g = _captured(Fn(lambda s, x: x.transpose(0, 2).sum(1).view(-1) * 2), [torch.randn(3, 1, 5)])
    r, notes = algebra(g)
    assert "size_one_reduction" in _rules(notes)
    _same(g, r, model, inputs, exact=True)
    _metas_hold(r, model, inputs)


def test_reductions_over_longer_dims_and_integer_sums_are_left_alone():
    model, inputs, g = _captured(Fn(lambda s, x, i: (torch.softmax(x, 1), x.sum(1), (i > 0).sum(1))),
                                 [torch.randn(3, 2), torch.randn(3, 1)])
    r, notes = algebra(g)
    assert notes == [] and r is g


# --- reductions through affine ops ----------------------------------------------------------------

AFFINE = [
    ("scale", lambda s, x: (x * 2.5).mean(-1)),
    ("row_bias", lambda s, x: (x + s.c).sum(-1)),
    ("row_scale", lambda s, x: (x * s.c).sum(-1, keepdim=True)),
    ("row_divisor", lambda s, x: (x / s.c).mean(dim=(1, 2))),
    ("rsub", lambda s, x: (s.c - x).sum(-1)),
    ("rsub_scalar", lambda s, x: (1.5 - x).sum()),
    ("neg", lambda s, x: (-x).mean(-1)),
    ("sub_scalar", lambda s, x: (x - 0.75).sum(dim=(1, 2), keepdim=True)),
]


@pytest.mark.parametrize("name,fn", AFFINE, ids=[c[0] for c in AFFINE])
def test_reductions_move_before_affine_ops_with_operands_constant_over_them(name, fn):
    model = Fn(fn, c=nn.Parameter(torch.randn(4, 1, 1)))
    x = torch.randn(4, 3, 5).exp()
    _check(model, [x], "reduction_through_affine")
    x = _edge_input((4, 3, 5), 0)  # NaN and +-inf in y propagate alike (a finite factor)
    m, inputs, g = _captured(model, [x])
    _same(g, algebra(g)[0], m, inputs)


def test_an_operand_varying_over_the_reduced_dim_is_left_alone():
    model, inputs, g = _captured(Fn(lambda s, x: (x * s.c).sum(-1), c=nn.Parameter(torch.randn(5))),
                                 [torch.randn(4, 5)])
    assert algebra(g)[1] == []


# --- matrix products ------------------------------------------------------------------------------

LINEAR = [
    ("sum", lambda s, x: s.fc(x).sum(-1), (6, 8)),
    ("mean_keep", lambda s, x: s.fc(x).mean(-1, keepdim=True), (6, 8)),
    ("full_mean", lambda s, x: s.fc(x).mean(), (6, 8)),
    ("batched_input", lambda s, x: s.fc(x).sum(-1), (2, 3, 8)),
    ("column_scale_bias", lambda s, x: ((s.fc(x) * s.col + s.b2) / s.div).mean(-1), (6, 8)),
    ("scalar_then_column", lambda s, x: ((s.fc(x) + 1.5) * s.col - s.b2).sum(-1), (2, 3, 8)),
    ("divided_shift", lambda s, x: ((s.fc(x) - 0.5) / s.col).sum(-1), (6, 8)),
    ("rsub", lambda s, x: (s.b2 - s.fc(x)).mean(-1), (6, 8)),
    ("no_bias", lambda s, x: s.fc2(x).sum(-1), (6, 8)),
]


@pytest.mark.parametrize("name,fn,shape", LINEAR, ids=[c[0] for c in LINEAR])
def test_sums_over_linear_outputs_become_matrix_vector_products(name, fn, shape):
    model = Fn(fn, fc=nn.Linear(8, 7), fc2=nn.Linear(8, 7, bias=False), col=nn.Parameter(torch.randn(7)),
               b2=nn.Parameter(torch.randn(7)), div=nn.Parameter(torch.rand(7) + 0.5))
    g, r, notes = _check(model, [torch.randn(*shape)], "linear_reduction")
    # the matrix-vector product is a multiply and a row sum: no matrix product is left for a
    # precision policy to narrow (tf32 / bf16 operands would round the reduced weights)
    assert not any(n.target in ("aten.addmm.default", "aten.mm.default", "aten.bmm.default") for n in r.nodes)
    assert graph_cost(r).flops < graph_cost(g).flops


def test_a_bf16_products_reduced_weights_and_terms_are_summed_in_float32():
    """A bf16 Linear's outputs summed (KernelBench level-2 14 under bf16 autocast): the weights'
    column sums and the row sums run in float32, rounded to bf16 once, so the result is no
    further from float64 than eager's bf16 one, which rounds each product."""
    torch.manual_seed(0)
    model = Fn(lambda s, x: (s.fc(x) / 2).sum(-1, keepdim=True) * 1.5, fc=nn.Linear(64, 256, bias=False))
    x = torch.rand(32, 64)
    wide = model(x).double()
    model, xb = model.bfloat16(), x.bfloat16()
    g = capture(from_module(model, [xb]))
    r, notes = algebra(g)
    assert "linear_reduction" in _rules(notes), notes
    sums = [n for n in r.nodes if n.target == "aten.sum.dim_IntList"]
    assert sums and all(n.meta.dtype == "float32" for n in sums)
    got = run_graph(r, model, [xb])[0]
    assert got.dtype == torch.bfloat16
    err, eager_err = (got.double() - wide).abs().max(), (model(xb).double() - wide).abs().max()
    assert err <= eager_err, (err, eager_err)


def test_sums_over_matmuls_and_bmms_of_inputs():
    _check(Fn(lambda s, x, y: torch.matmul(x, y).sum(-1)), [torch.randn(5, 4), torch.randn(4, 6)], "linear_reduction")
    _check(Fn(lambda s, x, y: (torch.bmm(x, y) * s.c).mean(dim=(1, 2)), c=nn.Parameter(torch.randn(3, 1, 6))),
           [torch.randn(3, 5, 4), torch.randn(3, 4, 6)], "linear_reduction")


def test_infinities_in_the_weights_propagate_as_in_the_original():
    """Weights (B) may hold infinities: the activation (A) is the factor pulled out of the sums."""
    model = Fn(lambda s, x: s.fc(x).sum(-1), fc=nn.Linear(4, 3))
    model, inputs, g = _captured(model, [torch.randn(5, 4)])
    with torch.no_grad():
        model.fc.weight[0, 1] = INF
        model.fc.weight[2, 3] = -INF
        model.fc.weight[1, 0] = NAN
    r, _ = algebra(g)
    _same(g, r, model, inputs)


def test_factors_varying_over_rows_and_other_readers_keep_the_product():
    """(A factor varying over the rows only is pulled out of the sum first: reduction_through_affine.)"""
    fc = nn.Linear(8, 7)
    for fn in (lambda s, x: (s.fc(x) * s.rows).sum(-1),  # a factor that varies over rows and columns
               lambda s, x: ((y := s.fc(x)).sum(-1), y),  # the product is read elsewhere
               lambda s, x: s.fc(x).sum(0)):  # not over the output features
        model, inputs, g = _captured(Fn(fn, fc=fc, rows=nn.Parameter(torch.randn(6, 7))), [torch.randn(6, 8)])
        r, notes = algebra(g)
        assert "linear_reduction" not in _rules(notes), notes
        assert any(n.target == "aten.addmm.default" for n in r.nodes)


# --- convolutions ---------------------------------------------------------------------------------

CONVS = [
    # (name, module, input shape, reduction)
    ("conv1d", nn.Conv1d(3, 4, 3), (2, 3, 9), "mean"),
    ("conv1d_strided_padded", nn.Conv1d(3, 4, 4, stride=3, padding=2, dilation=2), (2, 3, 11), "sum"),
    ("conv2d", nn.Conv2d(3, 5, 3, padding=1), (2, 3, 6, 7), "mean"),
    ("conv2d_stride_dilation", nn.Conv2d(2, 3, (3, 2), stride=(2, 3), padding=(2, 1), dilation=(2, 1)), (2, 2, 9, 8),
     "sum"),
    ("conv2d_grouped", nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 7, 7), "mean"),
    ("conv2d_depthwise", nn.Conv2d(3, 6, 3, padding=2, groups=3, bias=False), (2, 3, 5, 6), "sum"),
    ("conv3d", nn.Conv3d(2, 3, 3), (2, 2, 4, 5, 6), "mean"),
    ("conv3d_padded", nn.Conv3d(2, 3, (3, 1, 2), stride=(1, 2, 1), padding=(1, 0, 1)), (2, 2, 4, 5, 3), "sum"),
    ("conv_transpose1d", nn.ConvTranspose1d(3, 2, 3, stride=2, padding=1, output_padding=1), (2, 3, 5), "mean"),
    ("conv_transpose2d", nn.ConvTranspose2d(3, 4, 3), (2, 3, 5, 5), "mean"),
    ("conv_transpose2d_cropped", nn.ConvTranspose2d(2, 3, 4, stride=2, padding=2, dilation=2, output_padding=1),
     (2, 2, 4, 3), "sum"),
    ("conv_transpose2d_grouped", nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 4, 5), "mean"),
    ("conv_transpose3d", nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1, output_padding=1), (2, 2, 2, 3, 3), "sum"),
]


@pytest.mark.parametrize("name,conv,shape,kind", CONVS, ids=[c[0] for c in CONVS])
@pytest.mark.parametrize("extra", [(), (1,)], ids=["spatial", "and_channels"])
def test_spatial_sums_of_convolutions_come_from_box_sums(name, conv, shape, kind, extra):
    dims = tuple(range(2, len(shape))) + extra
    model = Fn(lambda s, x: getattr(s.conv(x), kind)(dim=dims, keepdim=bool(extra)), conv=conv)
    g, r, notes = _check(model, [torch.randn(*shape)], "conv_spatial_reduction")
    assert not any(n.target == "aten.convolution.default" for n in r.nodes)


def test_a_convolution_bias_added_after_it_moves_through_the_mean():
    model = Fn(lambda s, x: (s.conv(x) + s.b).mean(dim=(2, 3)), conv=nn.Conv2d(3, 4, 3, bias=False),
               b=nn.Parameter(torch.randn(4, 1, 1)))
    g, r, notes = _check(model, [torch.randn(2, 3, 6, 6)], "conv_spatial_reduction")
    assert "reduction_through_affine" in _rules(notes)


def _eval_bn(bn: nn.Module) -> nn.Module:
    """`bn` in eval mode with running statistics and affine weights far from their defaults."""
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.25, 4)
        if bn.affine:
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    return bn.eval()


EVAL_BN = [
    # (name, forward, modules, input shape): a mean over dims without the channels of an eval batch norm
    ("conv_transpose3d_scale_bn_pool",  # KernelBench level-2 77's pattern
     lambda s, x: s.pool(s.bn(s.conv(x) * 2.0)),
     dict(conv=nn.ConvTranspose3d(3, 4, 3), bn=nn.BatchNorm3d(4), pool=nn.AdaptiveAvgPool3d((1, 1, 1))), (2, 3, 3, 4, 5)),
    ("conv2d_bn_mean", lambda s, x: s.bn(s.conv(x)).mean(dim=(2, 3)),
     dict(conv=nn.Conv2d(3, 5, 3, padding=1), bn=nn.BatchNorm2d(5)), (2, 3, 6, 7)),
    ("conv2d_bn_no_affine_batch_and_space", lambda s, x: s.bn(s.conv(x)).mean(dim=(0, 2, 3)),
     dict(conv=nn.Conv2d(3, 5, 3), bn=nn.BatchNorm2d(5, affine=False)), (3, 3, 6, 6)),
    ("bn1d_mean_keepdim", lambda s, x: s.bn(x * 3.0).mean(dim=2, keepdim=True),
     dict(bn=nn.BatchNorm1d(4)), (2, 4, 9)),
]


@pytest.mark.parametrize("name,fn,mods,shape", EVAL_BN, ids=[c[0] for c in EVAL_BN])
def test_a_mean_over_an_eval_batch_norm_is_taken_before_it(name, fn, mods, shape):
    """The mean moves before the eval-mode batch norm (which then maps C values per item, not the
    whole tensor); where a convolution feeds it the convolution then goes through box sums."""
    model = Fn(fn, **{k: _eval_bn(v) if isinstance(v, nn.modules.batchnorm._BatchNorm) else v for k, v in mods.items()})
    g, r, notes = _check(model, [torch.randn(*shape)], "reduction_through_eval_batch_norm")
    assert not any(n.target == "aten._native_batch_norm_legit_no_training.default" for n in r.nodes)
    if "conv" in mods:
        assert "conv_spatial_reduction" in _rules(notes)
        assert not any(n.target == "aten.convolution.default" for n in r.nodes)


def test_nan_and_infinities_move_through_the_eval_batch_norm_as_through_the_original():
    """An infinite input element gives the same infinite mean either way; a zero batch-norm weight
    times it gives NaN in both; NaN stays NaN."""
    bn = _eval_bn(nn.BatchNorm2d(3))
    with torch.no_grad():
        bn.weight[2] = 0.0
    x = torch.randn(3, 3, 4, 4, dtype=torch.float64)
    x[0, 0, 1, 1], x[1, 1, 2, 0], x[1, 2, 3, 3], x[2, 0, 0, 0] = INF, -INF, INF, NAN
    model, inputs, g = _captured(Fn(lambda s, x: s.bn(x).mean(dim=(2, 3)), bn=bn), [x])
    r, notes = algebra(g)
    assert "reduction_through_eval_batch_norm" in _rules(notes)
    want = run_graph(g, model, inputs)[0]
    assert torch.isinf(want[0, 0]) and torch.isinf(want[1, 1]) and torch.isnan(want[1, 2]) and torch.isnan(want[2, 0])
    _same(g, r, model, inputs)


def test_batch_norms_in_training_mode_over_channels_or_read_elsewhere_keep_their_place():
    """Training-mode batch norm (the batch's statistics), a mean over the channel dim, a sum, and a
    batch-norm output that another node reads too are left to the other rules."""
    cases = [
        (lambda s, x: s.bn(x).mean(dim=(2, 3)), nn.BatchNorm2d(3).train()),
        (lambda s, x: s.bn(x).mean(dim=(1, 2)), _eval_bn(nn.BatchNorm2d(3))),
        (lambda s, x: s.bn(x).sum(dim=(2, 3)), _eval_bn(nn.BatchNorm2d(3))),
        (lambda s, x: (lambda y: (y.mean(dim=(2, 3)), y.amax(dim=(2, 3))))(s.bn(x)), _eval_bn(nn.BatchNorm2d(3))),
    ]
    for fn, bn in cases:
        model, inputs, g = _captured(Fn(fn, bn=bn), [torch.randn(2, 3, 4, 5)])
        r, notes = algebra(g)
        assert "reduction_through_eval_batch_norm" not in _rules(notes), notes
        _same(g, r, model, inputs)


GROUP_NORM_MEANS = [
    # (name, forward, modules, input shape): a mean over every spatial dim (and the channels) of a group norm
    ("conv3d_gn_mean_all",  # KernelBench level-2 23's pattern
     lambda s, x: s.gn(s.conv(x)).mean(dim=[1, 2, 3, 4]),
     dict(conv=nn.Conv3d(3, 8, 3), gn=nn.GroupNorm(4, 8)), (2, 3, 5, 6, 7)),
    ("conv3d_hardswish_gn_mean_all",  # and 27's
     lambda s, x: s.gn(F.hardswish(s.conv(x))).mean(dim=[1, 2, 3, 4]),
     dict(conv=nn.Conv3d(3, 6, 3), gn=nn.GroupNorm(3, 6)), (2, 3, 5, 5, 6)),
    ("conv2d_gn_spatial_mean", lambda s, x: s.gn(s.conv(x)).mean(dim=(2, 3)),
     dict(conv=nn.Conv2d(3, 6, 3), gn=nn.GroupNorm(2, 6)), (3, 3, 7, 6)),
    ("gn_no_affine_keepdim", lambda s, x: s.gn(x * 2.0).mean(dim=(1, 2, 3), keepdim=True),
     dict(gn=nn.GroupNorm(2, 4, affine=False)), (2, 4, 5, 5)),
    ("gn_one_channel_per_group", lambda s, x: s.gn(x).mean(dim=2), dict(gn=nn.GroupNorm(4, 4)), (3, 4, 10)),
]


@pytest.mark.parametrize("name,fn,mods,shape", GROUP_NORM_MEANS, ids=[c[0] for c in GROUP_NORM_MEANS])
def test_a_mean_of_a_group_norm_comes_from_channel_statistics(name, fn, mods, shape):
    """The normalized tensor is not computed: one reduction of the norm's input per channel (mean
    and variance) and per-channel arithmetic give the mean, after weight edits too."""
    model = Fn(fn, **mods)
    if model.gn.affine:
        with torch.no_grad():
            model.gn.weight.uniform_(-2, 2)
            model.gn.bias.uniform_(-1, 1)
    g, r, notes = _check(model, [torch.randn(*shape) * 3 + 1], "reduction_through_group_norm")
    assert not any(n.target == "aten.native_group_norm.default" for n in r.nodes)


def test_nan_and_infinities_reach_a_group_norms_mean_as_in_the_original():
    """A NaN or an infinity in one group of one image makes that image's group results NaN (so its
    mean over the channels NaN) and leaves the other images finite, both ways."""
    gn = nn.GroupNorm(2, 4)
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    x[0, 1, 2, 2], x[1, 3, 0, 4] = NAN, INF
    model, inputs, g = _captured(Fn(lambda s, x: s.gn(x).mean(dim=(2, 3)), gn=gn), [x])
    r, notes = algebra(g)
    assert "reduction_through_group_norm" in _rules(notes)
    want = run_graph(g, model, inputs)[0]
    assert torch.isnan(want[0, :2]).all() and torch.isnan(want[1, 2:]).all() and torch.isfinite(want[2]).all()
    assert torch.isfinite(want[0, 2:]).all() and torch.isfinite(want[1, :2]).all()
    _same(g, r, model, inputs)


def test_group_norms_reduced_over_the_batch_part_of_space_or_read_elsewhere_keep_their_place():
    """A mean over the batch dim, over some spatial dims only, a sum, and a group-norm output
    another node reads too are left to the other rules."""
    cases = [lambda s, x: s.gn(x).mean(dim=(0, 2, 3)), lambda s, x: s.gn(x).mean(dim=3),
             lambda s, x: s.gn(x).sum(dim=(2, 3)),
             lambda s, x: (lambda y: (y.mean(dim=(2, 3)), y.amax(dim=(2, 3))))(s.gn(x))]
    for fn in cases:
        model, inputs, g = _captured(Fn(fn, gn=nn.GroupNorm(2, 4)), [torch.randn(2, 4, 3, 5)])
        r, notes = algebra(g)
        assert "reduction_through_group_norm" not in _rules(notes), notes
        _same(g, r, model, inputs)


def test_nan_and_infinities_in_the_input_propagate_as_through_the_convolution():
    """The box sums read exactly the elements the convolution reads (an element left out by the
    stride stays out), and finite weights are the factor pulled out."""
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 2, stride=3, padding=1)
    x = torch.randn(3, 2, 7, 7, dtype=torch.float64)
    x[0, 0, 1, 1] = NAN  # rows and columns 1 and 4 are read by no output (stride 3)
    x[1, 0, 5, 2] = -INF
    x[1, 1, 3, 3] = INF
    x[2, 1, 0, 5] = NAN
    model, inputs, g = _captured(Fn(lambda s, x: s.conv(x).mean(dim=(2, 3)), conv=conv), [x])
    r, notes = algebra(g)
    assert "conv_spatial_reduction" in _rules(notes)
    want = run_graph(g, model, inputs)[0]
    assert torch.isfinite(want[0]).all() and torch.isinf(want[1]).any() and torch.isnan(want[2]).all()
    _same(g, r, model, inputs)


def test_taps_that_read_only_padding_are_dropped_and_non_contiguous_ones_refused():
    # one input row, padding 1 over the rows: taps 0 and 2 of the rows read only padding
    g, r, notes = _check(Fn(lambda s, x: s.conv(x).sum(dim=(2, 3)), conv=nn.Conv2d(2, 3, 3, padding=(1, 0))),
                         [torch.randn(2, 2, 1, 5)], "conv_spatial_reduction")
    assert any(n.target == "aten.slice.Tensor" and n.args[0] == Ref("p_conv_weight") for n in r.nodes)
    # padding 2, stride 2, one input position: taps 0 and 2 read it, tap 1 reads only padding
    model, inputs, g = _captured(Fn(lambda s, x: s.conv(x).sum(dim=2), conv=nn.Conv1d(2, 3, 3, stride=2, padding=2)),
                                 [torch.randn(2, 2, 1)])
    assert "conv_spatial_reduction" not in _rules(algebra(g)[1])


PARTIAL = [
    # (name, module, input shape, reduction, reduced dims, keepdim)
    ("conv2d_width", nn.Conv2d(3, 4, 3), (2, 3, 6, 7), "mean", (3,), False),
    ("conv2d_height_strided", nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 1), dilation=(2, 1)), (2, 2, 9, 5),
     "sum", (2,), True),
    ("conv2d_grouped_and_channels", nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 7, 6), "mean", (1, 2), True),
    ("conv3d_depth", nn.Conv3d(2, 3, 3, padding=1), (2, 2, 6, 4, 5), "sum", (2,), False),
    ("conv3d_depth_width", nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 1)), (2, 2, 5, 7, 6), "mean", (2, 4), True),
    # KernelBench's ConvTranspose3d + mean over depth: a transposed convolution over height and width
    ("conv_transpose3d_depth", nn.ConvTranspose3d(3, 4, 3, padding=1), (2, 3, 5, 4, 4), "mean", (2,), True),
    ("conv_transpose2d_cropped_height", nn.ConvTranspose2d(2, 3, 4, stride=2, padding=2, dilation=2, output_padding=1),
     (2, 2, 4, 3), "sum", (2,), False),
    ("conv_transpose2d_grouped_width", nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
     (2, 4, 4, 5), "mean", (3,), True),
]


@pytest.mark.parametrize("name,conv,shape,kind,dims,keep", PARTIAL, ids=[c[0] for c in PARTIAL])
def test_sums_over_some_spatial_dims_become_a_convolution_over_the_others(name, conv, shape, kind, dims, keep):
    """The reduced dims' window sums become input channels of a convolution over the kept dims (its
    rank one or two lower), equal to the original in float64 before and after the weights change."""
    model = Fn(lambda s, x: getattr(s.conv(x), kind)(dim=dims, keepdim=keep), conv=conv)
    g, r, notes = _check(model, [torch.randn(*shape)], "conv_spatial_reduction")
    (new,) = [n for n in r.nodes if n.target == "aten.convolution.default"]
    spatial = len(shape) - 2 - len([d for d in dims if d >= 2])
    assert len(r.meta(new.args[1].name).shape) == 2 + spatial
    assert graph_cost(r).flops < graph_cost(g).flops


def test_a_convolution_read_elsewhere_or_not_reduced_over_space_stays():
    conv = nn.Conv2d(3, 4, 3)
    for fn in (lambda s, x: (s.conv(x).mean(dim=(2, 3)), s.conv(x)), lambda s, x: s.conv(x).mean(dim=1),
               lambda s, x: torch.relu(s.conv(x)).mean(dim=(2, 3))):
        model, inputs, g = _captured(Fn(fn, conv=conv), [torch.randn(2, 3, 6, 6)])
        r, notes = algebra(g)
        assert any(n.target == "aten.convolution.default" for n in r.nodes), notes


# --- shipped problems -----------------------------------------------------------------------------

SHIPPED = [("level2/conv3d_mean.py", 1e-3, 0.4),
           ("level2/conv_transpose2d_global_avg_pool_bias_add_log_sum_exp_sum_multiply.py", 1e-3, 0.3)]


@pytest.mark.parametrize("path,flops,nbytes", SHIPPED, ids=[p[0] for p in SHIPPED])
def test_shipped_problems_lose_their_convolution_at_full_size_and_agree_at_small(path, flops, nbytes):
    """At full size (captured on the meta device) the FLOPs and minimum bytes drop by the factors
    given; at the SMALL size the rewritten graph gives the original's values in float64."""
    g = capture(load_problem(ROOT / "problems" / path))
    r, notes = algebra(g)
    before, after = graph_cost(g), graph_cost(r)
    assert after.flops < flops * before.flops and after.bytes < nbytes * before.bytes, (before, after)
    assert "conv_spatial_reduction" in _rules(notes)
    p = load_problem(ROOT / "problems" / path, small=True)
    model = p.make_model().double()
    inputs = [x.double() for x in p.make_inputs(0)]
    g = capture(from_module(model, inputs))
    r, _ = algebra(g)
    _same(g, r, model, inputs)
    _edit_weights(model)
    _same(g, r, model, inputs)


# --- random programs from the fuzzer's zoo ----------------------------------------------------------

# anchor -> the ranks of the first input (batch included) it takes
ANCHORS = {"linear": [2, 3, 4], "conv1d": [3], "conv2d": [4], "conv3d": [5], "conv_transpose2d": [4],
           "matmul_input": [2, 3], "bmm_input": [3]}


def _spec(seed: int):
    """A float64 program of the fuzzer's steps that the rules are meant for: an anchor, up to two
    pointwise steps with scalar or tensor operands, a sum / mean over the anchor's output features
    or its spatial dims (or another reduction), then now and then a reduction or softmax over the
    size-1 dim a kept dim leaves."""
    rng = random.Random(seed)
    for _ in range(50):
        anchor = rng.choice(sorted(ANCHORS))
        rank = rng.choice(ANCHORS[anchor])
        dims = tuple(rng.choice(s) for s in gen.DIM_SIZES[rank])
        layout = rng.choice(["contiguous", "contiguous", "transposed", "strided"])
        args = OPS[anchor].draw(rng, dims)
        if args is None:
            continue
        steps = [gen.Step(anchor, args)]
        for _ in range(rng.randint(0, 2)):
            op = rng.choice(["scalar", "tensor_op", "tensor_op", "activation"])
            steps.append(gen.Step(op, OPS[op].draw(rng, dims)))
        spatial = len(dims) - 1 if anchor.startswith("conv") else 1
        keep = rng.random() < 0.5
        fn = rng.choice(["sum", "sum", "mean", "mean", "amax", "logsumexp"])
        steps.append(gen.Step("reduce", {"fn": fn, "dim": list(range(-spatial, 0)), "keepdim": keep}))
        if keep and rng.random() < 0.6:
            tail = rng.choice(["reduce", "softmax"])
            if tail == "softmax":
                steps.append(gen.Step("softmax", {"log": rng.random() < 0.4, "dim": -1, "module": False}))
            else:
                steps.append(gen.Step("reduce", {"fn": rng.choice(["sum", "mean", "amax", "max", "logsumexp"]),
                                                 "dim": [-1], "keepdim": rng.random() < 0.5}))
        spec = gen.Spec(seed, rng.randint(2, 3), dims, layout, True, tuple(steps))
        try:
            return gen.render(spec)
        except Invalid:
            continue
    raise AssertionError(f"seed {seed}: no program")


def test_random_fuzz_programs_keep_their_values(tmp_path):
    fired: set[str] = set()
    for seed in range(24):
        path = tmp_path / f"p{seed}.py"
        path.write_text(_spec(seed))
        p = load_problem(path)
        g = capture(p)
        r, notes = algebra(g)
        fired |= _rules(notes)
        torch.manual_seed(seed)
        model = p.make_model()
        inputs = p.make_inputs(seed)
        _same(g, r, model, inputs)
        _metas_hold(r, model, inputs)
        full, _ = rewrite(g)  # the whole rewrite list agrees too
        _same(g, full, model, inputs)
    assert {"conv_spatial_reduction", "linear_reduction", "reduction_through_affine", "size_one_reduction",
            "size_one_softmax", "size_one_max"} <= fired, fired


# --- the fixed point, --no-rewrites, analysis, report -------------------------------------------------

def test_every_rule_has_a_precondition_and_a_proof():
    for rule in RULES:
        doc = rule.__doc__ or ""
        assert "Precondition:" in doc and "Proof" in doc, rule.__name__


def test_no_rewrites_leaves_the_graph_to_the_other_rewrites():
    model, inputs, g = _captured(Fn(lambda s, x: s.conv(x).mean(dim=(2, 3)), conv=nn.Conv2d(3, 4, 3)),
                                 [torch.randn(2, 3, 6, 6)])
    r, notes = rewrite(g, algebra=False)
    assert [n.target for n in r.nodes] == [n.target for n in rewrite(g, algebra=False)[0].nodes]
    assert not any(parse_note(x) for x in notes)
    assert "aten.convolution.default" in {n.target for n in r.nodes}
    r2, notes2 = rewrite(g)
    assert "aten.convolution.default" not in {n.target for n in r2.nodes}
    assert any(parse_note(x) for x in notes2)


def test_the_command_line_passes_no_rewrites(run, tmp_path, monkeypatch):
    from kernelwright import cli, pipeline
    from kernelwright.bench import runner

    seen = {}

    def fake_optimize(problem, out, opts):
        seen["optimize"] = opts.no_rewrites
        return {"verify": {"passed": True}}

    monkeypatch.setattr(pipeline, "optimize_problem", fake_optimize)
    problem = ROOT / "problems" / "level2" / "conv3d_mean.py"
    for flag, want in (([], False), (["--no-rewrites"], True)):
        p = run("optimize", problem, "--out", tmp_path / f"out{want}", "--device", "cpu", "--small", *flag)
        assert p.returncode == 0, p.stderr
        assert seen.pop("optimize") is want
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    monkeypatch.setattr(runner, "run_bench", lambda *a, **k: seen.update(bench=k["no_rewrites"]))
    p = run("bench", problem, "--out", tmp_path / "bench", "--no-rewrites")
    assert p.returncode == 0, p.stderr
    assert seen["bench"] is True
    row = runner._one(str(problem), {"small": True, "precision": "fp32", "baseline_only": False,
                                     "out_dir": str(tmp_path / "rows"), "trials": 1, "seconds": None,
                                     "no_rewrites": True})
    assert "error" not in row, row
    assert seen["optimize"] is True


def test_analysis_counts_flops_before_and_after_the_rewrites_and_the_report_lists_them():
    from kernelwright.analyze.coverage import captured_cost, plan_coverage
    from kernelwright.emit.report import render_report
    from kernelwright.plan import plan_graph

    g = capture(load_problem(ROOT / "problems" / "level2" / "conv3d_mean.py"))
    r, notes = rewrite(g)
    a = plan_coverage(plan_graph(r), [], captured_cost(g))
    assert a["flops"] == graph_cost(g).flops and a["flops_after_rewrites"] == graph_cost(r).flops
    assert a["bytes_after_rewrites"] < a["bytes"] and a["flops_after_rewrites"] < a["flops"] / 1000
    text = render_report({"problem": "conv3d_mean", "precision": "fp32", "device": "cpu", "capture": "ok",
                          "rewrites": notes + ["x: some other rewrite"], "analysis": a})
    assert "| mean | mean over the spatial dims" in text and "| conv_spatial_reduction |" in text
    removed = parse_note(next(x for x in notes if parse_note(x)))["flops_removed"]
    assert f"{removed:,}" in text and "- x: some other rewrite" in text
    assert "FLOPs 204.3 G as captured" in text


def test_norms_of_bf16_values_are_not_reduced_through():
    """A bf16 model's batch and group norms keep their place: the ops normalize in float32, and a
    bf16 mean taken first would round before the normalization does."""
    model = Fn(lambda s, x: (s.gn(x).mean(dim=(2, 3)), s.bn(x).mean(dim=(2, 3))),
               gn=nn.GroupNorm(2, 4), bn=_eval_bn(nn.BatchNorm2d(4))).bfloat16()
    g = capture(from_module(model, [torch.randn(2, 4, 5, 5, dtype=torch.bfloat16)]))
    _, notes = algebra(g)
    assert not _rules(notes) & {"reduction_through_group_norm", "reduction_through_eval_batch_norm"}, notes
