"""The project's own problem suite (problems/level1..3) and the bad-problem fixtures."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kernelwright.analyze import CLASSES, analyze, device_spec
from kernelwright.capture import CaptureError, capture
from kernelwright.errors import ProblemError
from kernelwright.problem import discover, load_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "problems"
BAD = Path(__file__).resolve().parents[1] / "fixtures" / "bad"

PROBLEM_FILES = discover([PROBLEMS])
IDS = [str(p.relative_to(PROBLEMS)) for p in PROBLEM_FILES]

# Problems that torch.export cannot capture, with a word from the expected reason.
# Empty today: every problem in the suite captures (nn.LSTM and nn.GRU are unrolled into
# per-time-step ATen ops). Add an entry here, never a skip, when one stops capturing.
NOT_CAPTURABLE: dict[str, str] = {}

# bytes, all inputs of one problem together: KernelBench's level 1 reaches 8.6 GB (l1_norm.py's
# 32768 x 65535 float32), and optimize must work at that size
FULL_INPUT_LIMIT = 10 * 2**30
SMALL_INPUT_LIMIT = 8192  # elements, all inputs of one small problem together


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    assert isinstance(out, (list, tuple)) and out, f"forward returned {type(out).__name__}"
    assert all(isinstance(o, torch.Tensor) for o in out)
    return list(out)


def test_suite_is_complete():
    by_level = {lvl: [p for p in PROBLEM_FILES if p.parent.name == f"level{lvl}"] for lvl in (1, 2, 3)}
    assert len(by_level[1]) >= 32
    assert len(by_level[2]) >= 14
    assert len(by_level[3]) >= 15
    # level 2's convolution problems cover what KernelBench's do: 3-D, transposed and 1-D convolutions
    conv = [p.stem for p in by_level[2] if "conv" in p.stem]
    assert len(conv) >= 25
    assert sum(n.startswith(("conv3d", "conv_transpose3d")) for n in conv) >= 8
    assert sum(n.startswith("conv_transpose2d") for n in conv) >= 5
    assert sum(n.startswith("conv1d") for n in conv) >= 2
    names = [p.stem for p in PROBLEM_FILES]
    assert len(names) == len(set(names)), "problem names must be unique across levels"


@pytest.mark.xdist_group("small_captures")
@pytest.mark.parametrize("path", PROBLEM_FILES, ids=IDS)
def test_small_problem_runs_and_captures(path, small_capture):
    problem = load_problem(path, small=True)
    assert problem.level in (1, 2, 3)
    model = problem.make_model("cpu")
    inputs = problem.make_inputs(0, "cpu")
    assert inputs and all(isinstance(x, torch.Tensor) for x in inputs)
    assert sum(x.numel() for x in inputs) <= SMALL_INPUT_LIMIT
    with torch.no_grad():
        outs = _tensors(model(*inputs))
    for o in outs:
        assert o.numel() > 0
        assert torch.isfinite(o).all(), f"{path.name}: non-finite output"
    # floating inputs are float32 (integer class targets are allowed)
    for x in inputs:
        assert x.dtype in (torch.float32, torch.int64), f"{path.name}: input dtype {x.dtype}"
    reason = NOT_CAPTURABLE.get(path.stem)
    if reason is None:
        graph = small_capture(path)  # capture(problem), shared with the other tests that read it
        assert graph.nodes and graph.outputs
        # every node is classified and costed; a problem does some work
        analysis = analyze(graph, device_spec("NVIDIA H200"))
        assert len(analysis.nodes) == len(graph.nodes)
        assert all(r.cls in CLASSES for r in analysis.nodes)
        assert analysis.totals["bytes"] > 0 and analysis.totals["roofline_us"] > 0
    else:
        with pytest.raises(CaptureError, match=reason):
            capture(problem)


@pytest.mark.parametrize("path", PROBLEM_FILES, ids=IDS)
def test_inputs_are_deterministic(path):
    problem = load_problem(path, small=True)
    a = problem.make_inputs(3, "cpu")
    b = problem.make_inputs(3, "cpu")
    c = problem.make_inputs(4, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(not torch.equal(x, y) for x, y in zip(a, c))
    m1, m2 = problem.make_model("cpu"), problem.make_model("cpu")
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


@pytest.mark.parametrize("path", PROBLEM_FILES, ids=IDS)
def test_full_size_is_realistic_and_fits(path):
    source = path.read_text()
    tree = ast.parse(source)
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    assert "SMALL" in assigned, f"{path.name} defines no SMALL"
    # sizes must be read at call time, never baked into default arguments
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            assert not node.args.args and not node.args.defaults, f"{path.name}: {node.name} takes arguments"
    problem = load_problem(path)
    small = problem._module.SMALL
    assert isinstance(small, dict) and small, f"{path.name}: SMALL is empty"
    inputs = problem.make_inputs(0, "meta")
    total = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    assert total < FULL_INPUT_LIMIT, f"{path.name}: full-size inputs are {total / 2**30:.2f} GiB"
    # full size really is bigger than the small one
    small_total = sum(x.numel() for x in load_problem(path, small=True).make_inputs(0, "meta"))
    assert sum(x.numel() for x in inputs) > 100 * small_total
    # the model builds and runs on the meta device at full size (shapes only); a recurrent one
    # only builds there: the meta LSTM/GRU runs its decomposition once per step (half a minute
    # for a 6-layer bidirectional stack), and its SMALL run checks the forward
    if any(isinstance(m, torch.nn.RNNBase) for m in problem.make_model("meta").modules()):
        return
    outs = problem.check("meta")
    assert outs


LOAD_ERRORS = {
    "missing_model.py": "missing Model",
    "missing_get_inputs.py": "missing get_inputs",
    "syntax_error.py": "syntax error at line 7",
    "not_a_module.py": "not a torch.nn.Module",
}
CHECK_ERRORS = {
    "init_raises.py": "Model(*get_init_inputs()) raised ValueError: width 8 is not supported",
    "forward_raises.py": "forward raised RuntimeError",
    "returns_non_tensor.py": "forward must return tensors (alone, or in tuples, lists and dicts), got dict holding a int",
}


def _assert_one_line(err: ProblemError, path: Path, fragment: str):
    msg = str(err)
    assert msg.startswith(f"{path}: "), msg
    assert "\n" not in msg, msg
    assert fragment in msg, msg


def test_bad_fixtures_are_all_listed():
    assert {p.name for p in BAD.glob("*.py")} == set(LOAD_ERRORS) | set(CHECK_ERRORS)


@pytest.mark.parametrize("name", sorted(LOAD_ERRORS))
def test_bad_problem_fails_to_load(name):
    path = BAD / name
    with pytest.raises(ProblemError) as info:
        load_problem(path)
    _assert_one_line(info.value, path, LOAD_ERRORS[name])


@pytest.mark.parametrize("name", sorted(CHECK_ERRORS))
def test_bad_problem_fails_check(name):
    path = BAD / name
    problem = load_problem(path)  # loads fine: the fault shows only when run
    with pytest.raises(ProblemError) as info:
        problem.check("cpu")
    _assert_one_line(info.value, path, CHECK_ERRORS[name])


def test_missing_file_and_folder():
    missing = BAD / "does_not_exist.py"
    with pytest.raises(ProblemError) as info:
        load_problem(missing)
    _assert_one_line(info.value, missing, "no such file")
    with pytest.raises(ProblemError) as info:
        load_problem(BAD)
    _assert_one_line(info.value, BAD, "is a folder")


@pytest.mark.parametrize("name,op", [("gru", "aten.gru.input"), ("lstm", "aten.lstm.input")])
def test_recurrent_layers_are_captured_as_one_op(name, op):
    """A recurrent layer stays one ATen op (run by the library), not T copies of its cell."""

    graph = capture(load_problem(ROOT / f"problems/level3/{name}.py", small=True), "meta")
    targets = [n.target for n in graph.nodes]
    assert targets.count(op) == 1 and len(targets) < 10, targets


def test_scaled_dot_product_attention_is_captured_as_one_op():
    """F.scaled_dot_product_attention stays one ATen op (the library's fused kernel), not its math
    form: no [T, T] scores, no mask built from aranges."""
    graph = capture(load_problem(ROOT / "problems/level3/gpt_block_sdpa.py", small=True), "meta")
    targets = [n.target for n in graph.nodes]
    assert targets.count("aten.scaled_dot_product_attention.default") == 1, targets
    assert not {"aten.bmm.default", "aten._softmax.default", "aten.arange.start_step"} & set(targets), targets


class _Histogram(torch.nn.Module):
    """A size only the data knows (bincount): no meta kernel, and an unbacked size in the graph."""

    def forward(self, ids, x):
        return x * 2, torch.bincount(ids.flatten(), minlength=4)[:2].float()


def test_a_data_dependent_size_is_a_one_line_capture_error_and_no_problem_error():
    """The meta-device check cannot run bincount: it leaves the check to the first real run; the
    capture refuses in one line (the original forward is kept), whatever torch raises inside."""
    from kernelwright.problem import from_module

    problem = from_module(_Histogram(), [torch.randint(0, 4, (3, 5)), torch.randn(3, 5)])
    assert problem.check("meta") is None
    assert len(problem.check("cpu")) == 2
    with pytest.raises(CaptureError, match="sizes by tensor values") as info:
        capture(problem)
    assert "\n" not in str(info.value)


VALUE_READING_INIT = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        rates = [x.item() for x in torch.linspace(0, 0.2, 3)]  # (Swin's drop-path rates)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in rates)
        self.rates = rates

    def forward(self, x):
        for layer, rate in zip(self.layers, self.rates):
            x = torch.relu(layer(x)) * (1 - rate)
        return x


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def test_a_constructor_that_reads_a_value_is_built_on_the_cpu_for_the_meta_device(tmp_path):
    """A Model whose __init__ reads a tensor's value (.item()) cannot be built on the meta device,
    where the pipeline builds models to learn shapes and modes: it is built on the CPU and moved,
    the same weights as a CPU build; the problem checks, and its modes and graph are captured."""
    from kernelwright.capture.modes import training_modes

    path = tmp_path / "rates.py"
    path.write_text(VALUE_READING_INIT)
    p = load_problem(path)
    meta, cpu = p.make_model("meta"), p.make_model("cpu")
    assert all(w.is_meta for w in meta.parameters()) and meta.rates == cpu.rates
    assert [o.shape for o in p.check()] == [torch.Size([4, 8])]
    assert training_modes(p, "both")[1] == ["any"]
    assert any(n.target == "aten.relu.default" for n in capture(p).nodes)


def test_fresh_inputs_keep_the_strides_of_a_view_with_gaps():
    """from_module's fresh inputs keep an example's strides where no two elements share memory,
    a view with gaps included (q sliced from a fused qkv projection), and make an expanded one
    contiguous."""
    from kernelwright.problem import from_module
    from kernelwright.problem.load import non_overlapping

    qkv = torch.randn(2, 8, 3 * 16)
    q = qkv[..., :16].reshape(2, 8, 2, 8).transpose(1, 2)
    expanded = torch.randn(4, 1).expand(4, 5)
    assert non_overlapping(q.shape, q.stride()) and not non_overlapping(expanded.shape, expanded.stride())
    fresh_q, fresh_e = from_module(torch.nn.Identity(), [q, expanded]).make_inputs(0)
    assert fresh_q.stride() == q.stride() and fresh_e.is_contiguous() and fresh_e.shape == expanded.shape


def test_fresh_inputs_near_the_examples_keep_their_values_within_the_noise():
    """With `near`, each fresh floating tensor is its example plus noise of `near` standard
    deviations of that example (a log-sum-exp near 40 stays near 40, its rows still consistent),
    different per draw; integer tensors are the examples' values."""
    from kernelwright.problem import from_module

    lse = torch.full((64, 128), 40.0) + torch.randn(64, 128)
    seeds = torch.tensor([7, 11])
    problem = from_module(torch.nn.Identity(), [lse, seeds], near=0.05)
    (a, ia), (b, ib) = problem.make_inputs(0), problem.make_inputs(1)
    for fresh in (a, b):
        noise = fresh - lse
        assert 0.02 < float(noise.std()) < 0.08 and float(noise.abs().max()) < 0.5
    assert not torch.equal(a, b) and torch.equal(ia, seeds) and torch.equal(ib, seeds)
    far = from_module(torch.nn.Identity(), [lse, seeds]).make_inputs(0)[0]
    assert float(far.mean()).__abs__() < 0.5  # without `near`: a standard normal draw
