"""CUDA C++ candidates for row-operation groups: matching, config space, rendering, NVRTC builds."""
import os

import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.codegen import cuda_unit
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Rows(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(96)

    def forward(self, x, y, z, w):
        return torch.log_softmax(x, -1), self.ln(y), z.amax(-1, keepdim=True), torch.softmax(w, 0)


def _groups():
    xs = [torch.randn(8, 96) for _ in range(4)]
    g = capture(from_module(Rows(), xs))
    return g, plan_graph(g).groups


def test_row_operations_are_matched_and_others_are_not():
    g, groups = _groups()
    rows = [cuda_unit.match(g, grp) for grp in groups]
    kinds = sorted((r.kind, r.op) for r in rows if r is not None)
    assert kinds == [("layernorm", "layernorm"), ("row_reduce", "max"), ("row_softmax", "log_softmax")]
    assert sum(r is None for r in rows) == 1  # softmax over dim 0 is not a last-dim row op
    ln = next(r for r in rows if r is not None and r.kind == "layernorm")
    assert (ln.M, ln.N) == (8, 96) and ln.weight and ln.bias


def test_space_respects_vector_width_and_registers():
    g, groups = _groups()
    for grp in groups:
        row = cuda_unit.match(g, grp)
        if row is None:
            continue
        space = cuda_unit.space(row)
        assert space and cuda_unit.default(row) in space
        assert all(c["vec"] == 1 or row.N % 4 == 0 for c in space)
        assert len(set(space)) == len(space)


@pytest.mark.nvrtc
def test_every_candidate_renders_a_module_and_compiles_with_nvrtc():
    pytest.importorskip("cuda.core")
    g, groups = _groups()
    n = 0
    for grp in groups:
        row = cuda_unit.match(g, grp)
        if row is None:
            continue
        for cfg in cuda_unit.space(row):
            text, ins = cuda_unit.render(g, grp, row, cfg.as_dict())
            compile(text, f"{grp.id}.py", "exec")
            assert "def launch(" in text and "_alloc(" in text and ins[0] == row.x
            cuda_unit._spec(row, cfg.as_dict()).compile(arch="sm_90", cache_dir=False)
            n += 1
    assert n >= 10
