"""Fusion planning: groups, levels, sibling merging and unit order."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelwright.capture import capture
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module


def _plan(model, *inputs):
    graph = capture(from_module(model, list(inputs)))
    return graph, plan_graph(graph)


def _check_order(graph, plan):
    """Every unit reads only values defined by graph inputs or earlier units."""
    defined = {i.name for i in graph.inputs}
    for unit in plan.units:
        if unit.group is not None:
            members = set(unit.group.nodes)
            for name in unit.group.nodes:
                for i in graph.node(name).inputs:
                    assert i in defined or i in members, f"{unit.name} reads {i} before it is defined"
            for i in unit.group.inputs:
                assert i in defined, f"{unit.name} input {i} not yet defined"
            defined.update(unit.group.nodes)
        else:
            for i in graph.node(unit.node).inputs:
                assert i in defined, f"{unit.node} reads {i} before it is defined"
            defined.add(unit.node)
    for o in graph.outputs:
        assert o in defined
    # every node is covered exactly once
    covered = [n for u in plan.units for n in (u.group.nodes if u.group else [u.node])]
    assert sorted(covered) == sorted(n.name for n in graph.nodes)
    ids = [g.id for g in plan.groups]
    assert len(ids) == len(set(ids))


class ReluMul(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class LinearSoftmaxRms(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 16)

    def forward(self, x):
        y = torch.softmax(self.l(x), -1)
        return y * torch.rsqrt((y * y).mean(-1, keepdim=True) + 1e-6)


class MishBranches(nn.Module):
    def forward(self, x):
        sp = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
        return x * torch.tanh(sp)


class TwoReductions(nn.Module):
    def forward(self, x):
        y = x - x.sum(-1, keepdim=True)
        return y.sum(0)


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 40)
        self.ln = nn.LayerNorm(40)

    def forward(self, x):
        y = torch.relu(self.l(x)) * 2
        z = torch.softmax(y, -1)
        r = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5)
        return self.ln(z + r).sum(1), y.argmax(1), F.gelu(y)


def test_pointwise_chain_is_one_group():
    graph, plan = _plan(ReluMul(), torch.randn(4, 8))
    assert len(plan.units) == 1 and len(plan.groups) == 1
    g = plan.groups[0]
    assert [graph.node(n).op for n in g.nodes] == ["relu", "mul"]
    assert g.rdims is None and g.kind == "pointwise"
    assert g.domain == (4, 8)
    assert g.inputs == ["x"]
    assert g.outputs == graph.outputs
    _check_order(graph, plan)


def test_softmax_rmsnorm_after_linear_is_one_group():
    graph, plan = _plan(LinearSoftmaxRms(), torch.randn(4, 8))
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert g.rdims == (1,)
    assert g.domain == (4, 16)
    ops = [graph.node(n).op for n in g.nodes]
    assert "_softmax" in ops and "mean" in ops and "rsqrt" in ops
    assert g.kind == "normalization"
    lib = [graph.node(u.node).op for u in plan.units if u.group is None]
    assert "addmm" in lib
    assert not any(graph.node(n).op == "addmm" for n in g.nodes)
    addmm = next(u.node for u in plan.units if u.group is None and graph.node(u.node).op == "addmm")
    assert addmm in g.inputs
    assert g.levels[next(n for n in g.nodes if graph.node(n).op == "mean")] == "row"
    assert g.levels[next(n for n in g.nodes if graph.node(n).op == "_softmax")] == "full"
    _check_order(graph, plan)


def test_mish_siblings_merge_into_one_group():
    graph, plan = _plan(MishBranches(), torch.randn(4, 8))
    ops = sorted(n.op for n in graph.nodes)
    assert ops == sorted(["gt", "exp", "log1p", "where", "tanh", "mul"])
    assert len(plan.units) == 1 and len(plan.groups) == 1
    assert sorted(plan.groups[0].nodes) == sorted(n.name for n in graph.nodes)
    assert plan.groups[0].rdims is None
    _check_order(graph, plan)


def test_mish_functional_is_one_group():
    graph, plan = _plan(nn.Mish(), torch.randn(4, 8))
    assert len(plan.groups) == 1 and len(plan.units) == 1
    _check_order(graph, plan)


def test_reduction_over_other_dim_starts_new_group():
    graph, plan = _plan(TwoReductions(), torch.randn(4, 8))
    assert len(plan.groups) == 2
    g0, g1 = plan.groups
    assert g0.rdims == (1,) and g1.rdims == (0,)
    assert g0.domain == g1.domain == (4, 8)
    # the second group reads what the first produced
    assert set(g1.inputs) & set(g0.outputs)
    _check_order(graph, plan)


def test_mixed_model_units_topological():
    graph, plan = _plan(Mixed(), torch.randn(5, 16))
    _check_order(graph, plan)
    assert any(graph.node(u.node).op == "addmm" for u in plan.units if u.group is None)
    for g in plan.groups:
        assert set(g.levels) == set(g.nodes)
        assert all(lvl in ("full", "row", "tuple") for lvl in g.levels.values())
        assert g.to_json()["id"] == g.id


def test_group_outputs_are_read_outside():
    graph, plan = _plan(Mixed(), torch.randn(5, 16))
    escaping = set(graph.outputs)
    for g in plan.groups:
        members = set(g.nodes)
        readers_outside = {i for n in graph.nodes if n.name not in members for i in n.inputs}
        for o in g.outputs:
            assert o in escaping or o in readers_outside
        for n in g.nodes:
            if n in escaping or n in readers_outside:
                if g.levels[n] != "tuple":
                    assert n in g.outputs


class RmsNormInFloat(nn.Module):
    """A half-precision model's RMSNorm: computed in float32, returned in the input's dtype."""

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h.to(x.dtype)


def test_dtype_conversions_leave_no_checks_that_keep_values_alive():
    graph, plan = _plan(RmsNormInFloat(), torch.randn(4, 8, dtype=torch.bfloat16))
    assert not any("assert" in n.op for n in graph.nodes)
    assert len(plan.groups) == 1 and plan.groups[0].outputs == graph.outputs


def test_run_graph_keeps_only_the_values_asked_for():
    """The tuning run keeps what crosses a unit's boundary: intermediates inside a fusion group
    are let go after their last use, the units' outputs and the graph's inputs stay."""
    from kernelwright.capture.execute import run_graph

    class M(nn.Module):
        def forward(self, x):
            y = torch.relu(x).abs()  # one pointwise group
            return torch.mm(y, x.t()).sum(1).tanh()

    x = torch.randn(4, 6)
    graph, plan = _plan(M(), x)
    crossing = {v for u in plan.units for v in u.outputs}
    env = run_graph(graph, M(), [x], keep=crossing)
    full = run_graph(graph, M(), [x], keep=True)
    assert set(env) < set(full) and crossing <= set(env)
    assert all(i.name in env for i in graph.inputs)
    for name in env:
        torch.testing.assert_close(env[name], full[name])


class _BnReluConv(nn.Module):
    """conv -> training batch norm -> ReLU -> conv; `returns_relu`: the ReLU is returned too (as an
    AOTAutograd forward saves it for the backward)."""

    def __init__(self, returns_relu):
        super().__init__()
        self.returns_relu = returns_relu
        self.c1, self.bn, self.c2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        r = torch.relu(self.bn(self.c1(x)))
        return (self.c2(r), r) if self.returns_relu else self.c2(r)


def test_a_reduction_group_writing_a_returned_value_leaves_its_channels_last_copy_to_a_unit_of_its_own():
    from kernelwright.plan.rewrites import rewrite

    for returns_relu in (False, True):
        graph = capture(from_module(_BnReluConv(returns_relu).train(), [torch.randn(2, 16, 8, 8)]))
        graph, _ = rewrite(graph, "tf32")  # the convolutions run channels-last
        plan = plan_graph(graph)
        _check_order(graph, plan)
        copies = [n.name for n in graph.nodes if n.target == "aten.clone.default" and n.args[0].name == "relu"]
        (norm,) = [u.group for u in plan.units if u.group is not None and u.group.rdims is not None]
        assert "relu" in norm.outputs
        if returns_relu:  # returned in eager's layout, and copied channels-last for c2 by a unit of its own
            (copy,) = copies
            assert graph.meta("relu").stride[1] != 1 and copy not in norm.nodes
            assert any(u.group is None and u.name == copy for u in plan.units)
        else:  # the group writes the ReLU channels-last, as c2 reads it: no copy
            assert copies == [] and graph.meta("relu").stride[1] == 1
