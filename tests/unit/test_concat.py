"""plan.concat: the values a cat joins computed into its buffer's slices, and the emitted forward
that allocates the buffer once, passes the slices to the kernels and copies the rest."""
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen.helpers import launch_out_params
from kernelwright.emit.program import forward_text
from kernelwright.plan import plan_graph
from kernelwright.plan.concat import Slot, place_concats
from kernelwright.problem import from_module


class Dense(nn.Module):
    """Each layer reads the cat of every feature so far (a DenseNet block)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(2 + 3 * i, 3, 3, padding=1) for i in range(3)])

    def forward(self, x):
        feats = [torch.relu(x)]
        for conv in self.convs:
            feats.append(conv(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


def _graph(model, *xs):
    g = capture(from_module(model.eval(), list(xs)))
    notes = place_concats(g)
    return g, notes


def test_a_dense_block_writes_every_feature_once_into_the_last_buffer():
    x = torch.randn(2, 2, 5, 5)
    g, notes = _graph(Dense(), x)
    cats = [n.name for n in g.nodes if n.target == "aten.cat.default"]
    root = cats[-1]
    assert len(notes) == 1 and notes[0].startswith(root)
    # the features (relu and the three convolutions) lie in the root at their offsets, and the
    # earlier cats are its prefixes
    placed = {v: s for v, s in g.slots.items() if s.placed}
    offsets = sorted(s.offset for v, s in placed.items() if g.node(v).target != "aten.cat.default")
    assert offsets == [0, 2, 5, 8]
    assert all(placed[c] == Slot(root, 1, 0, True) for c in cats[1:-1])
    stride = g.meta(root).stride
    assert all(g.meta(v).stride == stride for v in placed)
    # the graph computes the same values with the new strides recorded
    with torch.no_grad():
        torch.testing.assert_close(run_graph(g, Dense().eval(), [x])[0].shape, torch.Size([2, 11, 5, 5]))


class Mixed(nn.Module):
    def forward(self, x):
        a = torch.sigmoid(x)
        side = torch.cat([x, x.transpose(2, 3), a], 1)  # an input and a view: copied; a: placed
        return torch.cat([side, a], 1), a


def test_inputs_views_and_returned_values_are_copied_not_placed():
    x = torch.randn(2, 3, 4, 4)
    g, _ = _graph(Mixed(), x)
    cats = [n.name for n in g.nodes if n.target == "aten.cat.default"]
    side, out = cats
    assert g.slots[side] == Slot(out, 1, 0, True)  # read only by the later cat: a view of its buffer
    assert g.slots["x"] == Slot(out, 1, 0, False)
    view = next(v for v, s in g.slots.items() if s.offset == 3)
    assert not g.slots[view].placed  # a transpose's result keeps its own layout
    # `a` is returned: never a slice of a buffer (its caller sees eager's dense layout)
    assert "sigmoid" not in g.slots or not g.slots["sigmoid"].placed
    assert g.meta("sigmoid").stride == (48, 16, 4, 1)


def test_a_cat_nothing_can_be_placed_in_stays_a_cat():
    class Inputs(nn.Module):
        def forward(self, x, y):
            return torch.cat([x, y], 1) * 2.0

    g, notes = _graph(Inputs(), torch.randn(2, 3, 4), torch.randn(2, 1, 4))
    assert notes == [] and g.slots == {}


def test_the_forward_allocates_once_and_hands_kernels_their_slices():
    x = torch.randn(2, 2, 5, 5)
    g, _ = _graph(Dense(), x)
    plan = plan_graph(g)
    root = [n.name for n in g.nodes if n.target == "aten.cat.default"][-1]
    relu_unit = next(u for u in plan.units if u.group is not None and "relu" in u.group.outputs)
    kernels = {relu_unit.name: ("_k_relu", ["x"], ["relu"], False)}
    text = forward_text(plan, kernels, True, "eval", out_params={relu_unit.name: {0}})
    body = "\n".join(text.body)
    assert body.count("torch.empty_strided") == 1 and f"{root} = torch.empty_strided((2, 11, 5, 5)" in body
    assert f"relu, = _k_relu.launch(x, out0={root}.narrow(1, 0, 2))" in body
    assert "aten.cat" not in body  # the cats are views of the buffer or the buffer itself
    assert f"= _cp.into({root}, 1, 2, " in body  # a library convolution's result copied in once
    assert text.result == root


def test_launch_out_params_reads_the_last_launch_signature():
    src = "def launch(x, w, out=None):\n    pass\n\ndef launch(a0, a1, out0=None, out2=None):\n    pass\n"
    assert launch_out_params(src) == {0, 2}
    assert launch_out_params("def launch(a0):\n    pass\n") == set()


class NormConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(4), nn.Conv2d(4, 5, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(self.bn(x)))


@pytest.mark.parametrize("policy,dtype", [("tf32", "float32"), ("bf16", "bfloat16")])
def test_a_convolutions_channels_last_copy_joins_the_group_computing_its_input(policy, dtype):
    """Under tf32 (bf16) the convolution reads a channels-last (bf16) copy of its input: the
    batch-norm + ReLU group writes that copy itself (one kernel, its stores channels-last)
    instead of a second kernel reading the NCHW float32 result back."""
    from kernelwright.codegen.triton_group import lower
    from kernelwright.plan.rewrites import rewrite

    x = torch.randn(2, 4, 6, 6)
    g, _ = rewrite(capture(from_module(NormConv().eval(), [x])), policy)
    copy = next(n for n in g.nodes if "memory_format" in n.kwargs and n.args[0].name == "relu")
    plan = plan_graph(g)
    group = next(gr for gr in plan.groups if copy.name in gr.nodes)
    assert "relu" in group.nodes and group.outputs == [copy.name]
    assert not any(u.node == copy.name for u in plan.units)  # no unit of its own
    out = lower(g, group).outputs[0]
    assert out.value == copy.name and out.strides == (144, 1, 24, 4)  # channels-last over [2, 4, 6, 6]
    assert out.dtype == dtype


def test_a_candidate_that_cannot_write_the_slice_is_timed_with_its_copy():
    """The tuner times a library call (or a kernel whose launch takes no out<i>) of a unit whose
    output lies in a concatenation's buffer together with the copy into the slice, as the
    emitted forward runs it; with nothing placed the call is timed alone."""
    from kernelwright.search.units import KernelTuner

    x = torch.randn(2, 2, 5, 5)
    g, _ = _graph(Dense(), x)
    conv = next(v for v, s in g.slots.items() if s.placed and g.node(v).target == "aten.convolution.default")
    tuner = object.__new__(KernelTuner)
    tuner.graph, tuner.outputs = g, [(conv, None)]
    tuner.eager = [torch.zeros(g.meta(conv).shape)]
    calls = []

    def run():
        calls.append(1)
        return (torch.ones(g.meta(conv).shape),)

    timed = tuner._placed_after(run, list)
    assert timed is not run and timed()[0].sum() > 0 and calls == [1]
    wrong = tuner._placed_after(lambda: (torch.ones(3),), list)
    try:
        wrong()
    except RuntimeError:
        pass  # the copy into the slice ran (and refused a value of another shape)
    else:
        raise AssertionError("no copy into the slice")
    tuner.outputs = [("relu_never_placed", None)]
    g.slots.pop("relu_never_placed", None)
    assert tuner._placed_after(run, list) is run


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(2, 1, 4, 4))

    def forward(self, x):
        a = torch.sigmoid(x)
        inner = torch.cat([a, self.bias.expand(2, 1, 4, 4), self.bias], 1)
        return torch.cat([torch.tanh(x), inner], 1) * 2.0


def test_a_cat_inside_another_copies_what_is_not_in_its_slice():
    """A cat placed in a later cat's buffer (nested) copies the values it joins that lie nowhere
    (a parameter) when it runs; a view is copied into its slice once computed, a placed value is
    there already."""
    x = torch.randn(2, 3, 4, 4)
    g, _ = _graph(Nested(), x)
    inner, outer = [n.name for n in g.nodes if n.target == "aten.cat.default"]
    assert g.slots[inner] == Slot(outer, 1, 3, True)
    plan = plan_graph(g)
    body = "\n".join(forward_text(plan, {}, True, "eval").body)
    assert f"{inner} = {outer}.narrow(1, 3, 5)" in body
    assert f"_cp.copy_into({inner}.narrow(1, 4, 1), p_bias)" in body  # the parameter, copied as the cat runs
    assert f"_cp.copy_into({outer}.narrow(1, 6, 1), expand)" in body  # the view, once computed
    assert f"_cp.copy_into({inner}.narrow(1, 0, 3)," not in body  # the sigmoid lies in its slice already


@pytest.mark.interpreter
def test_the_densenet_block_problem_runs_its_cats_in_place(tmp_path):
    """The suite's DenseNet front (nested cats, one per layer) optimized under tf32 in eval mode
    on the CPU: verified, every cat of the block a view of one buffer that the layers' results
    are written into."""
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.problem import load_problem

    path = Path(__file__).resolve().parents[2] / "problems/level3/densenet_block.py"
    result = optimize_problem(load_problem(path, small=True), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, small=True, precision="tf32", mode="eval",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    assert any("computed into the concatenation's buffer" in n for n in result["rewrites"]), result["rewrites"]
    text = (tmp_path / "out" / "model_new.py").read_text()
    forward = text[text.index("def _kw_forward_eval"):]
    assert forward.count("torch.empty_strided") == 1 and "aten.cat" not in forward
    assert "library (aten.cat" not in text  # the file's unit list says where each cat lies


class Fire(nn.Module):
    """A SqueezeNet fire module: two convolutions + ReLU over one input, concatenated."""

    def __init__(self):
        super().__init__()
        self.squeeze, self.e1, self.e3 = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 5, 1), nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)


@pytest.mark.interpreter
# (tf32 differs from fp32 only in the dots' rounding, which the interpreter does not model)
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_convolution_whose_epilogue_lies_in_a_cat_writes_its_slice(tmp_path, precision):
    """A convolution + ReLU whose result a cat joins is one kernel (the template with the group as
    its epilogue) that stores into its slice of the concatenation's NCHW buffer: no ReLU pass, no
    copy, verified against eager."""
    from kernelwright.codegen import conv_epilogue
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.plan.concat import placed_slot

    x = torch.randn(2, 3, 6, 6)
    g, _ = _graph(Fire(), x)
    plan = plan_graph(g)
    for conv in [n for n in g.nodes if n.target == "aten.convolution.default"][1:]:
        group = next(gr for gr in plan.groups if conv.name in gr.inputs)
        assert placed_slot(g, group.outputs[0]) is not None  # its ReLU lies in the cat's buffer
        assert conv_epilogue.fusable(g, conv, group) is None
    out = tmp_path / "out"
    result = optimize_problem(from_module(Fire().eval(), [x]), out,
                              Options(device="cpu", budget_trials=2, no_library=True, precision=precision,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"]
    text = (out / "model_new.py").read_text()
    # (under bf16 the cat joins the bf16 results, its pieces rounded in the kernels that write them)
    assert len(re.findall(r"out0=cat\w*\.narrow\(1, ", text)) == 2 and "_cp." not in text
    fused = [r for r in result["groups"] if r["kind"] == "conv_epilogue"]
    assert len(fused) == 3 and all(r["seconds"] > 0 for r in fused)  # each search's wall time, recorded


class Transition(nn.Module):
    """A DenseNet transition (batch norm, ReLU, 1x1 convolution, average pool) whose result starts
    the next block's feature list, and that block's first layer."""

    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(8), nn.Conv2d(8, 6, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(6), nn.Conv2d(6, 4, 3, padding=1, bias=False)

    def forward(self, x):
        t = nn.functional.avg_pool2d(self.conv(torch.relu(self.bn(x))), 2)
        return torch.cat([t, self.conv2(torch.relu(self.bn2(t)))], 1)


@pytest.mark.interpreter
def test_a_pooled_convolution_writes_its_slice_of_the_next_blocks_buffer(tmp_path):
    """The transition's one kernel (prologue, convolution, pool) stores the pooled result into its
    slice of the cat's buffer, and so does the next layer's convolution: no copy."""
    from kernelwright.pipeline import Options, optimize_problem

    x = torch.randn(2, 8, 8, 8)
    out = tmp_path / "out"
    model = Transition().eval()
    for bn in (model.bn, model.bn2):  # non-trivial running statistics
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    result = optimize_problem(from_module(model, [x]), out,
                              Options(device="cpu", budget_trials=2, no_library=True, precision="tf32",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"]
    text = (out / "model_new.py").read_text()
    assert "out0=cat.narrow(1, 0, 6))" in text and "out0=cat.narrow(1, 6, 4))" in text and "_cp." not in text


class CrossDims(nn.Module):
    """A cat along the channels inside a cat along a spatial dim."""

    def forward(self, x0, x1):
        inner = torch.cat([torch.relu(x0 * 2.0), torch.sigmoid(x0)], dim=1)
        return torch.sigmoid(torch.cat([inner, x1], dim=3))


@pytest.mark.interpreter
def test_a_cat_inside_a_cat_along_another_dim_is_its_slice_along_that_dim(tmp_path):
    """The inner cat is the outer buffer narrowed along the outer cat's dim, to the inner cat's
    extent there (not its extent along its own dim), and the module verifies."""
    from kernelwright.pipeline import Options, optimize_problem

    x0, x1 = torch.randn(2, 5, 3, 5, 4), torch.randn(2, 10, 3, 5, 4)
    g, _ = _graph(CrossDims(), x0, x1)
    inner, outer = [n.name for n in g.nodes if n.target == "aten.cat.default"]
    assert g.slots[inner] == Slot(outer, 3, 0, True)
    body = "\n".join(forward_text(plan_graph(g), {}, True, "eval").body)
    assert f"{inner} = {outer}.narrow(3, 0, 5)" in body
    result = optimize_problem(from_module(CrossDims().eval(), [x0, x1]), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, db_path=str(tmp_path / "db.jsonl"),
                                      log=lambda s: None))
    assert result["verify"]["passed"] and not result.get("verify_fallback")
