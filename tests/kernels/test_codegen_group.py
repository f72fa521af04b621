"""Group kernels rendered from templates and run in the Triton interpreter against the library."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen.triton_group import lower, render_group
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


class Fn(nn.Module):
    def __init__(self, fn, n_params=0, shape=None):
        super().__init__()
        self.fn = fn
        if n_params:
            self.w = nn.Parameter(torch.randn(shape))
            self.b = nn.Parameter(torch.randn(shape))

    def forward(self, *xs):
        return self.fn(self, *xs)


class LN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        with torch.no_grad():
            self.ln.weight.normal_()
            self.ln.bias.normal_()

    def forward(self, x):
        return self.ln(x)


CASES = {
    # pointwise: per-row (B,1) and per-column (N,) broadcast operands
    "pointwise_bcast": (Fn(lambda s, x, r, c: torch.sigmoid(x * r + c) - x), [(6, 40), (6, 1), (40,)]),
    "pointwise_param": (Fn(lambda s, x: torch.tanh(x) * s.w + s.b, 1, (40,)), [(6, 40)]),
    "softmax": (Fn(lambda s, x: torch.softmax(x, -1)), [(6, 40)]),
    "log_softmax": (Fn(lambda s, x: torch.log_softmax(x, -1)), [(6, 40)]),
    "layer_norm": (LN(40), [(6, 40)]),
    "rms_norm": (Fn(lambda s, x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)), [(6, 40)]),
    "sum_dim1": (Fn(lambda s, x: x.sum(1)), [(3, 40, 5)]),
    "mean_dim1": (Fn(lambda s, x: x.mean(1, keepdim=True)), [(3, 40, 5)]),
    "amax_dim1": (Fn(lambda s, x: torch.amax(x, 1)), [(3, 40, 5)]),
    "argmax": (Fn(lambda s, x: torch.argmax(x, 1)), [(6, 40)]),
    "argmax_dim1_3d": (Fn(lambda s, x: torch.argmax(x, 1)), [(3, 40, 5)]),
    "max_dim": (Fn(lambda s, x: torch.max(x, -1)), [(6, 40)]),
    "var": (Fn(lambda s, x: torch.var(x, -1)), [(6, 40)]),
    "full_sum": (Fn(lambda s, x: (x * x).sum()), [(6, 40)]),
    "full_mean": (Fn(lambda s, x: x.mean()), [(5, 8)]),
    "normalize": (Fn(lambda s, x: F.normalize(x, dim=1)), [(6, 40)]),
    # a per-channel add (a conv's split-off bias) read through group norm's [N, G, C/G, H*W] view
    "bias_group_norm": (Fn(lambda s, x, b: torch.tanh(F.group_norm(x + b.view(-1, 1, 1), 2))), [(2, 8, 3, 5), (8,)]),
    # reshapes between elementwise ops and into a norm (a GEMM's [B*S, N] result as [B, S, N])
    "reshaped_chain": (Fn(lambda s, x, r: F.gelu((x * 2).view(2, 4, 10)).view(8, 10) + r), [(8, 10), (8, 10)]),
    "reshaped_layer_norm": (Fn(lambda s, x, res: F.layer_norm(x.view(2, 3, 40) * 0.5 + res, (40,)).view(6, 40) * 2),
                            [(6, 40), (2, 3, 40)]),
}

ONE_PASS = {"BLOCK_M": 2, "BLOCK_R": 512, "one_pass": True, "num_warps": 4, "num_stages": 1}
MULTI_PASS = {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4, "num_stages": 1}
POINTWISE = {"BLOCK_M": 256, "BLOCK_R": 1, "one_pass": False, "num_warps": 4}


def _setup(name):
    model, shapes = CASES[name]
    torch.manual_seed(0)
    inputs = [torch.randn(s) for s in shapes]
    graph = capture(from_module(model, inputs))
    plan = plan_graph(graph)
    with torch.no_grad():
        env = run_graph(graph, model, inputs, keep=True)
    return graph, plan, env


def _run(graph, group, env, cfg, tmp_path, tag):
    k = render_group(graph, group, cfg)
    mod = load_module_from_source(k.source, f"{group.id}_{tag}", tmp_path)
    outs = mod.launch(*[env[v] for v in k.inputs])
    return k, mod, outs


def _compare(k, outs, env):
    assert len(outs) == len(k.outputs)
    for name, out in zip(k.outputs, outs):
        ref = env[name]
        assert out.shape == ref.shape, name
        assert out.dtype == ref.dtype, name
        if ref.dtype in (torch.int64, torch.int32, torch.bool):
            assert torch.equal(out, ref), name
        else:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_reshapes_do_not_split_groups():
    for name in ("reshaped_chain", "reshaped_layer_norm"):
        _, plan, _ = _setup(name)
        assert len(plan.groups) == 1, [g.nodes for g in plan.groups]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("mode", ["one_pass", "multi_pass"])
def test_group_matches_library(name, mode, tmp_path):
    graph, plan, env = _setup(name)
    assert plan.groups, "expected at least one fusion group"
    for group in plan.groups:
        if group.rdims is None:
            cfg = POINTWISE
        else:
            cfg = dict(ONE_PASS if mode == "one_pass" else MULTI_PASS)
        k, mod, outs = _run(graph, group, env, cfg, tmp_path, f"{name}_{mode}")
        if group.rdims is not None and mode == "multi_pass":
            assert k.R > cfg["BLOCK_R"] or k.R <= 16, "multi-pass config should loop over R"
        _compare(k, outs, env)


def test_a_per_channel_add_folds_into_the_group_norm_group():
    graph, plan, env = _setup("bias_group_norm")
    assert len(plan.groups) == 1 and plan.groups[0].domain == (2, 2, 4, 15)
    assert {graph.node(n).target for n in plan.groups[0].nodes} >= {"aten.add.Tensor", "aten.native_group_norm.default"}


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "softmax", "sum_dim1"])
def test_eviction_hints_mark_reread_rows_evict_last_and_last_reads_evict_first(name, tmp_path):
    graph, plan, env = _setup(name)
    group = [g for g in plan.groups if g.rdims is not None][0]
    k, _, outs = _run(graph, group, env, dict(MULTI_PASS, EVICT=True), tmp_path, f"{name}_evict")
    _compare(k, outs, env)
    src = k.source
    writes_rows = any(graph.meta(o).shape == group.domain for o in k.outputs)
    if writes_rows:  # read in a statistics pass, then again to write: kept in L2 in between
        assert src.index("evict_last") < src.rindex("evict_first")
    else:  # one pass over the rows: nothing to keep
        assert "evict_first" in src and "evict_last" not in src
    assert "eviction_policy" not in render_group(graph, group, MULTI_PASS).source


def test_other_strides_are_copied_and_wrong_shapes_raise(tmp_path):
    graph, plan, env = _setup("softmax")
    group = plan.groups[0]
    k, mod, _ = _run(graph, group, env, ONE_PASS, tmp_path, "strides")
    x = env[k.inputs[0]]
    xt = x.t().contiguous().t()  # same shape, column-major strides
    assert xt.shape == x.shape and xt.stride() != x.stride()
    torch.testing.assert_close(mod.launch(xt)[0], mod.launch(x)[0], rtol=0, atol=0)
    with pytest.raises(ValueError):
        mod.launch(torch.randn(3, 40))  # wrong shape


def test_source_documents_group_and_params(tmp_path):
    for name in ("layer_norm", "pointwise_bcast", "max_dim"):
        graph, plan, env = _setup(name)
        for group in plan.groups:
            cfg = POINTWISE if group.rdims is None else ONE_PASS
            k = render_group(graph, group, cfg)
            assert group.id in k.source
            for v in k.inputs:
                assert f"# input {v}:" in k.source, (name, v)
            # one documented kernel parameter per operand (an input may be loaded at two strides)
            n_input_comments = k.source.count("# input ")
            assert n_input_comments >= len(k.inputs), (name, n_input_comments, k.inputs)
            for v in k.outputs:
                assert f"# output {v}:" in k.source, (name, v)
            compile(k.source, f"{group.id}.py", "exec")


def test_one_pass_needs_block_r_ge_r():
    from kernelwright.codegen.triton_group import Unsupported

    graph, plan, env = _setup("softmax")
    with pytest.raises(Unsupported):
        render_group(graph, plan.groups[0], {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": True, "num_warps": 4})


def test_channels_last_group_walks_memory_order_and_writes_channels_last(tmp_path):
    from kernelwright.capture.shapes import channels_last_strides
    from kernelwright.codegen.triton_group import Unsupported, lower, transposed_walk
    from kernelwright.plan.rewrites import rewrite
    from kernelwright.space.group_space import tiled_default

    model = Fn(lambda s, x: torch.relu(s.conv2(torch.tanh(s.conv(x)) * 3.0 + 1.0)))
    model.conv, model.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)
    x = torch.randn(2, 3, 6, 5)
    graph, _ = rewrite(capture(from_module(model, [x])), "tf32")
    plan = plan_graph(graph)
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
    group = next(g for g in plan.groups if any(graph.node(n).target == "aten.tanh.default" for n in g.nodes))
    k, _, outs = _run(graph, group, env, POINTWISE, tmp_path, "cl")
    # between two channels-last convolutions: one flat index walks input and output contiguously
    assert "mc0" not in k.source and "om_in0 = m" in k.source
    out = outs[0]
    assert out.stride() == channels_last_strides(out.shape)
    torch.testing.assert_close(out, env[k.outputs[0]], rtol=1e-5, atol=1e-5)
    # the last bias add + relu computes the model's output: written in eager's layout
    last = next(g for g in plan.groups if graph.outputs[0] in g.outputs)
    assert transposed_walk(lower(graph, last)) is not None
    for tag, cfg in (("flat", POINTWISE), ("tiled", tiled_default().as_dict())):
        k2, _, outs2 = _run(graph, last, env, cfg, tmp_path, f"cl_out_{tag}")
        assert outs2[0].is_contiguous()
        torch.testing.assert_close(outs2[0], env[graph.outputs[0]], rtol=1e-5, atol=1e-5)
    assert "BLOCK_Q" in k2.source and "tl.program_id(2)" in k2.source
    with pytest.raises(Unsupported):  # the first group's operands agree: no tiled walk
        render_group(graph, group, tiled_default().as_dict())


def _tf32_norm_group(model, x):
    """`model` in training mode captured and rewritten under tf32, the values of every node, its
    first reduction group and that group's lowering."""
    from kernelwright.codegen.triton_group import lower
    from kernelwright.plan.rewrites import rewrite

    model.train()
    graph, _ = rewrite(capture(from_module(model, [x])), "tf32")
    with torch.no_grad():
        env = run_graph(graph, copy.deepcopy(model), [x], keep=True)
    group = next(g for g in plan_graph(graph).groups if g.rdims is not None)
    return graph, env, group, lower(graph, group)


@pytest.mark.parametrize("norm", ["group", "batch_train"])
def test_a_norm_over_a_channels_last_conv_walks_its_input_in_memory_order(norm, tmp_path):
    """Under tf32 a conv feeding a norm runs channels-last: the norm group reads the NHWC result
    in memory order (the input's innermost dim innermost in the walk) in every schedule, and
    writes the returned value in eager's NCHW layout."""
    from kernelwright.codegen.triton_group import _layout

    model = Fn(lambda s, x: torch.tanh(s.norm(s.conv(x))))
    model.conv = nn.Conv2d(3, 8, 3, padding=1)
    model.norm = nn.GroupNorm(2, 8) if norm == "group" else nn.BatchNorm2d(8)
    graph, env, group, low = _tf32_norm_group(model, torch.randn(2, 3, 6, 5))
    kept, red = _layout(low)
    main = low.inputs.index(next(o for o in low.inputs if o.level == "full"))
    assert red[-1][1][main] == 1 or kept[-1][1][main] == 1  # channels (innermost in NHWC) walked innermost
    split = {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4, "num_stages": 1}
    wide = dict(split, BLOCK_M=64, BLOCK_R=64)  # the strided long-row default's shape (rows masked)
    reverse = dict(split, APPLY_REVERSE=True)  # the apply pass walks its tiles last to first
    for tag, cfg in (("one", ONE_PASS), ("multi", MULTI_PASS), ("split", split), ("wide", wide), ("reverse", reverse)):
        k, _, outs = _run(graph, group, env, cfg, tmp_path, f"{norm}_{tag}")
        out = outs[k.outputs.index(graph.outputs[0])]
        assert out.is_contiguous()
        torch.testing.assert_close(out, env[graph.outputs[0]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("log", [False, True])
def test_a_softmax_over_a_channels_last_convs_pixels_splits_its_rows(log, tmp_path):
    """A softmax over the flattened pixels of a channels-last convolution's result (KernelBench's
    ConvTranspose3d + clamp + spatial softmax): few rows, long and strided. The split schedule
    keeps each split's running max and sum of exp, combines them per row with the max's rescaling,
    and matches eager, as the row schedule does; a row whose split holds only masked lanes adds 0."""
    def forward(s, x):
        y = torch.clamp(s.conv(x), 0.0, 1.0)
        b, c = y.shape[:2]
        z = (torch.log_softmax if log else torch.softmax)(y.view(b, c, -1), dim=2)
        return z.view(y.shape) * s.scale

    model = Fn(forward)
    model.conv = nn.ConvTranspose3d(3, 8, 3, stride=2, padding=1, output_padding=1)
    model.scale = nn.Parameter(torch.randn(1, 8, 1, 1, 1))
    graph, env, group, low = _tf32_norm_group(model, torch.randn(2, 3, 2, 3, 4))
    split = {"BLOCK_M": 4, "BLOCK_R": 16, "SPLIT": 8, "one_pass": False, "num_warps": 4, "num_stages": 1}
    for tag, cfg in (("row", dict(MULTI_PASS, BLOCK_M=8, BLOCK_R=16)), ("split", split),
                     ("wide", dict(split, BLOCK_M=64, BLOCK_R=64, SPLIT=32)), ("reverse", dict(split, APPLY_REVERSE=True))):
        k, _, outs = _run(graph, group, env, cfg, tmp_path, f"softmax_{log}_{tag}")
        assert ("_partial" in k.source) == (tag != "row")
        out = outs[k.outputs.index(graph.outputs[0])]
        torch.testing.assert_close(out, env[graph.outputs[0]], rtol=1e-5, atol=1e-5)


def test_a_softmax_over_the_channels_of_a_channels_last_conv_walks_rows_along_the_output_pixels(tmp_path):
    """KernelBench's ConvTranspose2d + softmax over channels + epilogue, returned NCHW: the rows
    (pixels) of the channels-last convolution's result are the output's contiguous dim. With
    INNER the rows are walked per image in blocks of pixels (p, a run the compiler sees in the
    output's offsets), in the one-pass and the looped schedule, with a pixel count that is not a
    multiple of the block; the tuner offers such configs first, beside the row schedule as it is."""
    from kernelwright.codegen.triton_group import Unsupported, inner_rows
    from kernelwright.policy import get_policy
    from kernelwright.search.units import GroupTuner

    def forward(s, x):
        return torch.sigmoid(torch.softmax(s.conv(x), dim=1) * 2.0 + s.bias)

    model = Fn(forward)
    model.conv = nn.ConvTranspose2d(3, 16, 4, stride=2, padding=1, output_padding=1)
    model.bias = nn.Parameter(torch.randn(16, 1, 1))
    graph, env, group, low = _tf32_norm_group(model, torch.randn(3, 3, 3, 4))  # 7 x 9 pixels per image
    outer, (P, _) = inner_rows(low)
    assert P == 63 and [size for size, _ in outer] == [3]
    for tag, cfg in (("one", dict(ONE_PASS, BLOCK_M=32, INNER=True)), ("multi", dict(MULTI_PASS, BLOCK_M=16, INNER=True))):
        k, _, outs = _run(graph, group, env, cfg, tmp_path, f"inner_{tag}")
        assert "po = pid // " in k.source and f"grid = ({3 * -(-63 // cfg['BLOCK_M'])},)" in k.source
        out = outs[k.outputs.index(graph.outputs[0])]
        assert out.is_contiguous()
        torch.testing.assert_close(out, env[graph.outputs[0]], rtol=1e-5, atol=1e-5)
    # a row-level output beside the full one (the max over the channels, [N, 1, H, W])
    model2 = Fn(lambda s, x: (lambda y: (torch.softmax(y, dim=1), torch.amax(y, dim=1, keepdim=True)))(s.conv(x)))
    model2.conv = model.conv
    g2, env2, grp2, low2 = _tf32_norm_group(model2, torch.randn(3, 3, 3, 4))
    assert inner_rows(low2) is not None
    k, _, outs = _run(g2, grp2, env2, dict(MULTI_PASS, BLOCK_M=16, INNER=True), tmp_path, "inner_rowout")
    for name, out in zip(k.outputs, outs):
        torch.testing.assert_close(out, env2[name], rtol=1e-5, atol=1e-5)
    tuner = GroupTuner(graph, group, env, get_policy("tf32"), "cpu", tmp_path, False)
    assert tuner.seeds[0]["INNER"] and tuner.seeds[0]["BLOCK_M"] >= 32 and "INNER" not in tuner.seeds[1].as_dict()
    assert all(c in tuner.space for c in tuner.seeds)
    # a group whose output is not contiguous along its rows has no such walk
    plain = Fn(lambda s, x: torch.softmax(x, -1))
    g3 = capture(from_module(plain, [torch.randn(6, 40)]))
    grp = plan_graph(g3).groups[0]
    assert inner_rows(lower(g3, grp)) is None
    with pytest.raises(Unsupported):
        render_group(g3, grp, dict(ONE_PASS, INNER=True))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_batch_norm_over_one_channel_loads_its_statistics_once(training, tmp_path):
    """BatchNorm1d(1) (an LSTM's h_n, [batch, 1, hidden], normalized): the statistics and weights of
    the single channel do not move along the domain; they are loaded once, as scalars, in every
    schedule (a masked block load of one address fails to compile)."""
    model = Fn(lambda s, x: torch.tanh(s.bn(x)))
    model.bn = nn.BatchNorm1d(1, eps=1e-3, momentum=None)
    with torch.no_grad():
        model.bn.running_mean.fill_(0.3), model.bn.running_var.fill_(2.0), model.bn.weight.fill_(1.5)
    model.train(training)
    x = torch.randn(3, 1, 16)
    graph = capture(from_module(model, [x]))
    with torch.no_grad():
        env = run_graph(graph, copy.deepcopy(model), [x], keep=True)
    groups = plan_graph(graph).groups
    assert groups
    for group in groups:
        for tag, cfg in (("one", ONE_PASS), ("multi", MULTI_PASS), ("pw", POINTWISE)):
            if (group.rdims is None) != (tag == "pw"):
                continue
            k, _, outs = _run(graph, group, env, cfg, tmp_path, f"bn1_{training}_{tag}")
            _compare(k, outs, env)


def test_offsets_are_int32_unless_an_operand_spans_2_31_elements():
    from kernelwright.codegen.triton_group import extent, lower, needs_int64

    small = Fn(lambda s, x: torch.softmax(x, -1))
    for shape, wide in (((64, 1024), False), ((65536, 40000), True)):
        x = torch.empty(shape, device="meta")
        graph = capture(from_module(small, [x]))
        group = plan_graph(graph).groups[0]
        low = lower(graph, group)
        M, R, _ = extent(low)
        assert needs_int64(low, M + 1, R + 1024) is wide
        src = render_group(graph, group, {"BLOCK_M": 1, "BLOCK_R": 1024, "one_pass": False, "num_warps": 4}, low).source
        assert (".to(tl.int64) * BLOCK_M" in src) is wide


def test_a_training_batch_norm_over_a_gemm_result_runs_split_and_row_schedules(tmp_path):
    """BatchNorm1d (training) over a Linear's [batch, features] result reduces each feature over
    the batch: strided rows. Rows side by side (row schedule) and rows split over programs (the
    split schedule for long ones) both give eager's result and running statistics."""
    from kernelwright.codegen.triton_group import extent

    model = Fn(lambda s, x: torch.relu(s.bn(s.fc(x))))
    model.fc, model.bn = nn.Linear(8, 12), nn.BatchNorm1d(12)
    graph, env, group, low = _tf32_norm_group(model, torch.randn(40, 8))
    assert extent(low) == (12, 40, False)  # 12 features, each a strided row of 40 batch elements
    split = {"BLOCK_M": 4, "BLOCK_R": 8, "SPLIT": 4, "one_pass": False, "num_warps": 4, "num_stages": 1}
    for tag, cfg in (("row", dict(MULTI_PASS, BLOCK_M=32, BLOCK_R=16)), ("split", split),
                     ("wide", dict(split, BLOCK_M=64, BLOCK_R=64)), ("reverse", dict(split, APPLY_REVERSE=True))):
        k, _, outs = _run(graph, group, env, cfg, tmp_path, f"bn1d_{tag}")
        assert ("_partial" in k.source) == (tag != "row")
        _compare(k, outs, env)  # the normalised result and the new running mean and variance


def test_an_output_is_written_in_its_recorded_layout_or_a_broadcast_of_one():
    """Dense permutations (contiguous, transposed) and broadcasts of them (an expand the group ends
    with: its readers are specialised for stride 0) keep their recorded strides; anything else (a
    slice's gaps, another rank) is written contiguous."""
    from kernelwright.capture.graph import TensorMeta
    from kernelwright.codegen.triton_group import written_stride

    assert written_stride(TensorMeta((4, 3), (1, 4), "float32"), 2) == (1, 4)
    assert written_stride(TensorMeta((27,), (0,), "float32"), 1) == (0,)
    assert written_stride(TensorMeta((4, 3), (1, 0), "float32"), 2) == (1, 0)
    assert written_stride(TensorMeta((4, 3), (6, 1), "float32"), 2) == (3, 1)  # (a slice: gaps)
    assert written_stride(TensorMeta((4, 3), (0, 1), "float32"), 3) == (3, 1)  # (not of the domain's rank)
