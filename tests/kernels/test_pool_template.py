"""Pooling node template (codegen/triton_pool.py) run in the Triton interpreter against the library."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.capture.graph import Graph, Input, OpNode, Ref, TensorMeta
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.codegen.triton_pool import TARGETS, TEMPLATE
from kernelwright.problem import from_module
from kernelwright.space.config import Config
from fn_module import Fn

pytestmark = pytest.mark.interpreter


def _setup(model, x):
    graph = capture(from_module(model, [x]))
    node = next(n for n in graph.nodes if n.target in TARGETS)
    env = run_graph(graph, model, [x], keep=True)
    return graph, node, env


def _other_config(graph, node) -> Config:
    """A config from the space other than the default: the smallest block (several programs)."""
    default = TEMPLATE.default(graph, node)
    space = TEMPLATE.space(graph, node)
    assert default in space
    return min((c for c in space if c != default), key=lambda c: (c["BLOCK"], -c["num_warps"]))


def _check(graph, node, env, config, tmp_path, used=None):
    used = used_outputs(graph, node) if used is None else used
    kernel = TEMPLATE.render(graph, node, config, used)
    assert kernel.outputs == len(node.outs)
    mod = load_module_from_source(kernel.source, node.name, tmp_path)
    got = mod.launch(*[env[name] for name in kernel.inputs])
    ref = env[node.name]
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert isinstance(got, tuple) and len(got) == len(node.outs)
    for i, (g, r) in enumerate(zip(got, refs)):
        if i not in used and not (i == 0 and node.target.startswith("aten.avg")):
            assert g is None
            continue
        if r.dtype == torch.int64:
            assert torch.equal(g, r), (g, r)
        else:
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6, equal_nan=True)
    return kernel


CASES = {
    # 1-D pools are captured as unsqueeze -> *_pool2d -> squeeze
    "max1d": (nn.MaxPool1d(3, 2, 1), (2, 3, 11)),
    "max1d_idx_dil_ceil": (nn.MaxPool1d(4, 3, 2, dilation=2, ceil_mode=True, return_indices=True), (2, 2, 13)),
    "max2d": (nn.MaxPool2d(2), (2, 3, 6, 6)),
    "max2d_idx_dil_ceil": (Fn(lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 1), dilation=(2, 1), ceil_mode=True,
                                                     return_indices=True)), (1, 2, 9, 7)),
    "max2d_only_idx": (Fn(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[1]), (1, 2, 7, 7)),
    "max2d_unbatched": (nn.MaxPool2d(3, 2, 1, return_indices=True), (2, 7, 6)),
    "max3d_idx_pad": (nn.MaxPool3d(3, 2, 1, return_indices=True), (1, 2, 4, 5, 5)),
    "avg1d_nopad_count": (nn.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 10)),
    "avg2d_pad_ceil": (nn.AvgPool2d(3, 2, 1, ceil_mode=True), (2, 2, 8, 8)),
    "avg2d_exclude_pad": (nn.AvgPool2d(3, 2, 1, count_include_pad=False, ceil_mode=True), (1, 2, 8, 7)),
    "avg2d_divisor": (nn.AvgPool2d((2, 3), (1, 2), (1, 1), divisor_override=5), (1, 2, 5, 7)),
    "avg3d": (nn.AvgPool3d(2), (1, 2, 4, 4, 4)),
    "avg3d_pad_exclude": (nn.AvgPool3d((2, 3, 3), (1, 2, 2), 1, ceil_mode=True, count_include_pad=False), (1, 2, 3, 6, 5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pool_matches_library(case, tmp_path):
    torch.manual_seed(0)
    model, shape = CASES[case]
    graph, node, env = _setup(model, torch.randn(shape))
    tmpl, why = template_for(graph, node)
    assert tmpl is TEMPLATE, why
    _check(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    _check(graph, node, env, _other_config(graph, node), tmp_path)


@pytest.mark.parametrize("target,args,shape", [
    ("aten.max_pool2d_with_indices.default", ([3, 2], [2, 1], [1, 1], [2, 1], True), (2, 5, 9, 7)),
    ("aten.max_pool3d_with_indices.default", ([3, 3, 3], [2, 2, 2], [1, 1, 1]), (1, 6, 4, 5, 5)),
    ("aten.avg_pool2d.default", ([3, 3], [2, 2], [1, 1], True, False), (2, 5, 8, 7)),
])
def test_channels_last_pool_reads_and_writes_channels_last(target, args, shape, tmp_path):
    """After a channels-last convolution the pool reads NHWC and writes NHWC, like the library."""
    torch.manual_seed(0)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = torch.randn(shape).contiguous(memory_format=fmt)
    ref = getattr(torch.ops.aten, target.split(".")[1]).default(x, *args)
    graph, node = _hand_graph(target, args, x, ref)
    assert not graph.meta("x").contiguous and not node.outs[0].contiguous
    used = {0, 1} if isinstance(ref, tuple) else {0}
    for config in (TEMPLATE.default(graph, node), _other_config(graph, node)):
        kernel = _check(graph, node, {"x": x, "pool": ref}, config, tmp_path, used=used)
        assert "channels-last" in kernel.source
        got = load_module_from_source(kernel.source, f"cl_{config['BLOCK']}", tmp_path).launch(x)
        refs = ref if isinstance(ref, tuple) else (ref,)
        assert [t.stride() for t in got] == [r.stride() for r in refs]


@pytest.mark.parametrize("target,args,shape,cl_in", [
    ("aten.avg_pool3d.default", ([2, 2, 2], [2, 2, 2]), (2, 5, 4, 6, 6), True),
    ("aten.avg_pool2d.default", ([3, 3], [2, 2], [1, 1], True, False), (2, 5, 8, 7), True),
    ("aten.max_pool2d_with_indices.default", ([3, 2], [2, 1], [1, 1], [2, 1], True), (2, 5, 9, 7), True),
    ("aten.max_pool3d_with_indices.default", ([3, 3, 3], [2, 2, 2], [1, 1, 1]), (1, 6, 4, 5, 5), False),
])
def test_pool_between_layouts(target, args, shape, cl_in, tmp_path):
    """A channels-last input pooled into a contiguous result (aten.avg_pool3d's, after a channels-last
    convolution) and the reverse: one pass, values and indices as the library's, each output in the
    layout its metadata names."""
    torch.manual_seed(0)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = torch.randn(shape)
    ref = getattr(torch.ops.aten, target.split(".")[1]).default(x, *args)
    refs = ref if isinstance(ref, tuple) else (ref,)
    if cl_in:
        x = x.contiguous(memory_format=fmt)
    else:
        refs = tuple(r.contiguous(memory_format=fmt) for r in refs)
    graph, node = _hand_graph(target, args, x, refs if len(refs) > 1 else refs[0])
    assert graph.meta("x").contiguous != cl_in and node.outs[0].contiguous == cl_in
    used = set(range(len(refs)))
    for config in (TEMPLATE.default(graph, node), _other_config(graph, node)):
        kernel = TEMPLATE.render(graph, node, config, used)
        got = load_module_from_source(kernel.source, f"mixed_{config['BLOCK']}", tmp_path).launch(x)
        for g, r in zip(got, refs):
            assert g.stride() == r.stride()
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_indices_skipped_when_unused(tmp_path):
    graph, node, env = _setup(nn.MaxPool2d(3, 2, 1), torch.randn(1, 2, 7, 7))
    assert used_outputs(graph, node) == {0}
    k = _check(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    assert "idx_ptr" not in k.source and "int64" not in k.source.split("def launch")[0]
    k2 = _check(graph, node, env, TEMPLATE.default(graph, node), tmp_path, used={0, 1})
    assert "idx_ptr" in k2.source


def test_max_nan_and_neg_inf_like_pytorch(tmp_path):
    x = torch.randn(1, 2, 7, 7)
    x[0, 0, 2, 3] = float("nan")
    x[0, 0, 4, 4] = float("nan")
    x[0, 1, :4, :4] = float("-inf")  # windows with only -inf: index of the first in-bounds element
    x[0, 1, 5, 5] = 3.0
    x[0, 1, 5, 6] = 3.0  # ties: the first occurrence
    model = Fn(lambda t: F.max_pool2d(t, 3, 2, 1, dilation=1, return_indices=True))
    graph, node, env = _setup(model, x)
    _check(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    _check(graph, node, env, TEMPLATE.default(graph, node), tmp_path, used={0})


def test_half_input(tmp_path):
    model = nn.AvgPool2d(3, 2, 1)
    x = torch.randn(1, 2, 6, 6).half()
    graph, node, env = _setup(model, x)
    k = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
    got = load_module_from_source(k.source, "half", tmp_path).launch(x)[0]
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, env[node.name], rtol=1e-3, atol=1e-3)


def _hand_graph(target, args, x, ref):
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = [TensorMeta(tuple(r.shape), tuple(r.stride()), str(r.dtype).replace("torch.", "")) for r in refs]
    meta = TensorMeta(tuple(x.shape), tuple(x.stride()), "float32")  # channels-last x stays so
    node = OpNode("pool", target, (Ref("x"),) + tuple(args), {}, outs)
    return Graph("hand", [Input("x", "user", meta, index=0)], [node], ["pool"]), node


@pytest.mark.parametrize("target,args", [
    ("aten.avg_pool1d.default", ([3], [2], [1], False, False)),
    ("aten.max_pool1d_with_indices.default", ([3], [2], [1], [2])),
])
def test_aten_1d_ops(target, args, tmp_path):
    """The 1-D ATen ops never appear in captured graphs (they are decomposed), but are accepted."""
    x = torch.randn(2, 3, 10)
    op = getattr(torch.ops.aten, target.split(".")[1]).default
    ref = op(x, *args)
    graph, node = _hand_graph(target, args, x, ref)
    used = {0, 1} if isinstance(ref, tuple) else {0}
    _check(graph, node, {"x": x, "pool": ref}, TEMPLATE.default(graph, node), tmp_path, used=used)


def test_unsupported_reasons():
    graph, node, _ = _setup(nn.MaxPool2d(2), torch.randn(1, 4, 4, 4))
    assert TEMPLATE.supports(graph, node, {0}) is None
    xin = graph.inputs[0]
    hw = dataclasses.replace(xin, meta=TensorMeta(xin.meta.shape, (64, 16, 1, 4), "float32"))  # H, W swapped
    g_hw = Graph(graph.name, [hw], graph.nodes, graph.outputs)
    why = TEMPLATE.supports(g_hw, node, {0})
    assert why and "contiguous" in why and "\n" not in why
    g_int = Graph(graph.name, [dataclasses.replace(xin, meta=TensorMeta(xin.meta.shape, xin.meta.stride, "int32"))],
                  graph.nodes, graph.outputs)
    assert "dtype" in TEMPLATE.supports(g_int, node, {0})
    other = next(n for n in graph.nodes if n.target == "getitem")
    assert TEMPLATE.supports(graph, other, {0})
    assert TEMPLATE.supports(graph, node, set())
    with pytest.raises(ValueError):
        TEMPLATE.render(g_hw, node, TEMPLATE.default(graph, node), {0})


def test_launch_checks_shape_and_copies_other_strides(tmp_path):
    graph, node, env = _setup(nn.AvgPool2d(2), torch.randn(1, 2, 4, 4))
    k = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
    mod = load_module_from_source(k.source, "chk", tmp_path)
    with pytest.raises(ValueError):
        mod.launch(torch.randn(1, 2, 4, 6))
    x = torch.randn(1, 2, 4, 4)
    xt = x.transpose(2, 3).contiguous().transpose(2, 3)  # same values and shape, other strides: copied
    torch.testing.assert_close(mod.launch(xt)[0], mod.launch(x)[0], rtol=0, atol=0)
    with pytest.raises(ValueError):
        mod.launch(torch.randn(1, 2, 4, 4, dtype=torch.float64))


def test_source_documents_parameters_and_space():
    graph, node, _ = _setup(nn.MaxPool2d(3, 2, 1, return_indices=True), torch.randn(1, 2, 7, 7))
    space = TEMPLATE.space(graph, node)
    assert space and all(c.template == "triton.pool" for c in space)
    assert all(1 <= c["BLOCK"] // (32 * c["num_warps"]) <= 16 for c in space)
    assert TEMPLATE.default(graph, node) in space
    src = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node).as_dict(), {0, 1}).source
    sig = re.search(r"@triton\.jit\ndef \w+\(\n(.*?)\n\):", src, re.S).group(1)
    params = [ln for ln in sig.splitlines() if ln.strip()]
    assert len(params) > 10
    for ln in params:
        assert re.match(r"\s+\w+(: tl\.constexpr)?,  # \S", ln), ln
    assert "def launch(x):" in src and "from ._host import _alloc, _cdiv, _expect, _launch" in src


def test_default_heuristic_large():
    x = TensorMeta((32, 64, 112, 112), (64 * 112 * 112, 112 * 112, 112, 1), "float32")
    y = TensorMeta((32, 64, 56, 56), (64 * 56 * 56, 56 * 56, 56, 1), "float32")
    node = OpNode("mp", "aten.max_pool2d_with_indices.default", (Ref("x"), [3, 3], [2, 2], [1, 1]), {},
                  [y, dataclasses.replace(y, dtype="int64")])
    graph = Graph("big", [Input("x", "user", x, index=0)], [node], ["mp"])
    cfg = TEMPLATE.default(graph, node)
    assert cfg.as_dict() == {"BLOCK": 512, "num_warps": 4, "num_stages": 1}
    assert cfg in TEMPLATE.space(graph, node)
