"""The strided-copy node template: copies of permuted, sliced or broadcast views into dense
tensors (attention's head split and merge), with or without a float cast."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen.node_kernels import templates_for, used_outputs
from kernelwright.codegen.triton_strided_copy import TEMPLATE, copy_plan, offsets
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


class Heads(nn.Module):
    """By-hand attention's copies: q, k split from one projection into [b, h, s, d] (rows), kᵀ
    contiguous (a transpose), heads merged back (rows), a broadcast made dense, a cast on the way."""

    def forward(self, x, w):
        b, s, c3 = x.shape
        c = c3 // 3
        q, k, v = x.split(c, dim=2)
        q = q.view(b, s, 4, c // 4).transpose(1, 2).contiguous()
        kt = k.view(b, s, 4, c // 4).transpose(1, 2).transpose(-2, -1).contiguous()
        merged = q.transpose(1, 2).contiguous().view(b, s, c)
        wide = w.expand(b, -1, -1).contiguous()
        half = v.permute(2, 0, 1).to(dtype=torch.bfloat16, memory_format=torch.contiguous_format)
        return q * 2, kt * 2, merged * 2, wide * 2, half * 2


def _copies():
    x, w = torch.randn(4, 64, 192), torch.randn(1, 64, 256)  # (every copy at least MIN_ELEMENTS)
    graph = capture(from_module(Heads(), [x, w]))
    nodes = [n for n in graph.nodes if n.target in TEMPLATE.TARGETS and TEMPLATE.supports(graph, n, used_outputs(graph, n)) is None]
    return graph, nodes


def _input_like(graph, node, seed):
    src = graph.meta(node.args[0].name)
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(max(1, sum((n - 1) * s for n, s in zip(src.shape, src.stride)) + 1), generator=g)
    return torch.as_strided(base.to(getattr(torch, src.dtype)), src.shape, src.stride)


def test_each_copy_kind_matches_torch_across_its_space(tmp_path):
    graph, nodes = _copies()
    kinds = {TEMPLATE._plan(graph, n).kind for n in nodes}
    assert kinds == {"rows", "transpose"} and len(nodes) == 5
    for i, node in enumerate(nodes):
        assert [t.name for t in templates_for(graph, node)] == ["triton.strided_copy"]
        space = TEMPLATE.space(graph, node)
        assert TEMPLATE.default(graph, node) in space
        x = _input_like(graph, node, i)
        want = torch.empty_strided(node.meta.shape, node.meta.stride, dtype=getattr(torch, node.meta.dtype)).copy_(x)
        for j, cfg in enumerate(dict.fromkeys([TEMPLATE.default(graph, node), space[0], space[len(space) // 2], space[-1]])):
            k = TEMPLATE.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
            (y,) = load_module_from_source(k.source, f"strided_{node.name}_{j}", tmp_path).launch(x)
            assert y.stride() == node.meta.stride and y.dtype == want.dtype
            assert torch.equal(y, want), (node.name, cfg)


def test_small_copies_stay_torchs():
    class Small(nn.Module):
        def forward(self, x):
            return x.t().contiguous() * 2

    graph = capture(from_module(Small(), [torch.randn(30, 40)]))
    node = next(n for n in graph.nodes if n.target == "aten.clone.default")
    assert "fewer than" in TEMPLATE.supports(graph, node, used_outputs(graph, node))


def test_dims_merge_where_both_layouts_allow():
    # kᵀ of [2, 4 heads, 2 dims, 5 positions] read from a [2, 5, 24] projection: heads and dims
    # merge into one input-contiguous dim of 8; the positions are the output's innermost
    p = copy_plan((2, 4, 2, 5), (120, 2, 1, 24), (40, 10, 5, 1))
    assert p.kind == "transpose" and (p.a.size, p.a.xs) == (5, 24) and (p.b.size, p.b.xs, p.b.ys) == (8, 1, 5)
    assert [(d.size, d.xs, d.ys) for d in p.rest] == [(2, 120, 40)] and not p.wide
    # a permutation that keeps the innermost dim: rows of 64, the other dims not mergeable
    p = copy_plan((16, 12, 1024, 64), (1024 * 2304, 64, 2304, 1), (786432, 65536, 64, 1))
    assert p.kind == "rows" and p.a.size == 64 and p.n_rest == 16 * 12 * 1024
    assert offsets(p.rest, "r", "x") == "(r // 12288) * 2359296 + ((r // 1024) % 12) * 64 + (r % 1024) * 2304"
    # offsets past 2**31 elements are computed in 64 bits
    assert copy_plan((1 << 16, 1 << 16), (1, 1 << 16), (1 << 16, 1)).wide


def test_channels_last_and_same_layout_copies_are_left_to_others():
    class Copies(nn.Module):
        def forward(self, x):
            return x.clone(memory_format=torch.channels_last) * 2, x.clone() * 3, x.t().clone() if x.dim() == 2 else x

    graph = capture(from_module(Copies(), [torch.randn(4, 16, 16, 32)]))
    for node in (n for n in graph.nodes if n.target == "aten.clone.default"):
        why = TEMPLATE.supports(graph, node, used_outputs(graph, node))
        assert why is not None and ("channels-last" in why or "same layout" in why)
