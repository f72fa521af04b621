"""End to end on the CPU: optimize shipped level-1 problems (Triton interpreter) and use the output."""
from __future__ import annotations

import os

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelwright.emit.module import import_model_new
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.problem import load_problem

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
LEVEL1 = ROOT / "problems" / "level1"

# level-1 problems with no GEMM / convolution / pooling / scan
PROBLEMS = [
    "relu", "gelu", "gelu_tanh", "silu", "mish", "sigmoid", "tanh", "softplus", "elu", "selu", "hardswish",
    "hardtanh", "leaky_relu", "softmax", "log_softmax", "layer_norm", "rms_norm", "l2_normalize",
    "frobenius_norm", "sum_dim", "mean_dim", "max_dim", "argmax_dim", "argmin_dim", "mse_loss", "huber_loss",
    "cross_entropy", "kl_div", "hinge_loss", "triplet_margin_loss", "batch_norm_train", "group_norm",
    "instance_norm", "max_pool1d", "max_pool2d", "avg_pool2d", "avg_pool3d", "cumsum", "cumprod",
    "reverse_cumsum", "exclusive_cumsum",
]
# the emitted modules checked in a process without kernelwright: a representative handful
SUBPROCESS = ["relu", "mish", "softmax", "layer_norm", "sum_dim", "argmax_dim", "cross_entropy", "batch_norm_train"]

# at top level: the runtime files fall back on kernelwright's own copies only where they are loaded
# outside an emitted folder (test_emitted_modules_run_standalone checks that an emitted module
# imports no kernelwright)
KW_IMPORT = re.compile(r"^(import kernelwright|from kernelwright)", re.M)


def test_problem_list_is_shipped():
    for name in PROBLEMS:
        assert (LEVEL1 / f"{name}.py").exists(), name


def _optimize(name, tmp_path):
    out = tmp_path / name
    result = optimize_problem(load_problem(LEVEL1 / f"{name}.py", small=True), out,
                              Options(device="cpu", budget_trials=2, small=True,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    return out, result


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    """optimized(name): the output folder and result of optimizing problem `name` (in a folder of its
    own, with a trial database of its own), made once for the tests of this module that read it."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = _optimize(name, tmp_path_factory.mktemp(name))
        return done[name]
    return get


@pytest.mark.xdist_group("optimized_level1")  # with the other test reading `optimized`, in one worker
@pytest.mark.parametrize("name", PROBLEMS)
def test_optimize_level1(name, optimized):
    out, result = optimized(name)
    assert result["verify"]["passed"], result["verify"]
    for f in ("model_new.py", "report.md", "result.json"):
        assert (out / f).is_file(), f
    saved = json.loads((out / "result.json").read_text())
    assert saved["problem"] == name
    stages = saved["stages"]  # where the run's wall time went, stage by stage
    assert list(stages) == ["eager", "capture", "tune", "emit and final checks"]
    assert all(t >= 0 for t in stages.values()) and sum(stages.values()) <= saved["seconds"] + 0.05
    assert (out / "kernels").is_dir()
    triton_groups = [("" if m == "any" else f"{m}_") + g["id"] for m, r in result["modes"].items()
                     for g in r["groups"] if g["strategy"] == "triton"]  # kernel files are named by mode
    files = sorted((out / "kernels").glob("*.py"))
    kernel_files = [p for p in files if not p.name.startswith("_")]  # the rest: the runtime
    assert len(kernel_files) == len(triton_groups)
    assert {p.stem for p in kernel_files} == set(triton_groups)
    for p in [out / "model_new.py", *files]:
        text = p.read_text()
        assert not KW_IMPORT.search(text), f"{p.name} imports kernelwright"
        compile(text, str(p), "exec")

    # in-process: ModelNew is a drop-in replacement with the same parameters and buffers
    problem = load_problem(LEVEL1 / f"{name}.py", small=True)
    mod = import_model_new(out / "model_new.py")
    ref = problem.make_model("cpu")
    new = mod.ModelNew(*problem.get_init_inputs())
    assert list(new.state_dict().keys()) == list(ref.state_dict().keys())
    new.load_state_dict(ref.state_dict())
    inputs = problem.make_inputs(123)
    with torch.no_grad():
        want = ref(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        got = new(*inputs)
    want = want if isinstance(want, (tuple, list)) else [want]
    got = got if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.is_floating_point():
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), (g - w).abs().max()
        else:
            assert torch.equal(g, w)


# Checks each folder given on the command line: its model_new.py imports without kernelwright and
# ModelNew matches Model on fresh inputs. Prints "OK <folder>" after each.
SCRIPT = r"""
import importlib.util, sys, torch
for i, folder in enumerate(sys.argv[1:]):
    spec = importlib.util.spec_from_file_location(f"model_new_{i}", f"{folder}/model_new.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[f"model_new_{i}"] = m
    spec.loader.exec_module(m)
    assert "kernelwright" not in {k.split(".")[0] for k in sys.modules}, f"{folder}: kernelwright was imported"
    torch.manual_seed(0)
    ref = m.Model(*m.get_init_inputs())
    new = m.ModelNew(*m.get_init_inputs())
    assert list(new.state_dict()) == list(ref.state_dict()), (folder, list(new.state_dict()), list(ref.state_dict()))
    new.load_state_dict(ref.state_dict())
    for seed in (7, 8):
        torch.manual_seed(seed)
        xs = m.get_inputs()
        with torch.no_grad():
            want = ref(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs])
            got = new(*xs)
        want = want if isinstance(want, (tuple, list)) else [want]
        got = got if isinstance(got, (tuple, list)) else [got]
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (folder, g.shape, w.shape)
            if w.is_floating_point():
                assert torch.allclose(g, w, rtol=1e-4, atol=1e-5), (folder, float((g - w).abs().max()))
            else:
                assert torch.equal(g, w), folder
    print("OK", folder, flush=True)
"""


@pytest.mark.xdist_group("optimized_level1")
def test_emitted_modules_run_standalone(optimized):
    """The emitted modules of a representative handful run in a process of their own (one for all of
    them: each import checks that no kernelwright module has been loaded)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    folders = []
    for name in SUBPROCESS:
        out, result = optimized(name)
        assert result["verify"]["passed"], (name, result["verify"])
        folders.append(str(out))
    p = subprocess.run([sys.executable, "-c", SCRIPT, *folders], env=env, capture_output=True, text=True,
                       timeout=600)
    ok = [line.split(" ", 1)[1] for line in p.stdout.splitlines() if line.startswith("OK ")]
    assert p.returncode == 0 and ok == folders, f"{p.stdout}\n{p.stderr[-3000:]}"


CONSTANTS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Tensors made inside forward from Python data (KernelBench's torch.min(x, torch.tensor(v)))."""

    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        y = torch.min(self.fc(x), torch.tensor(0.25, device=x.device))
        scale = torch.tensor([float(i) for i in range({n})], device=x.device)
        return torch.clamp(y * scale, max=torch.tensor(float("inf"))) + torch.tensor([1, 2] * {half})


def get_inputs():
    return [torch.randn(4, {n})]


def get_init_inputs():
    return [{n}]
'''


def test_tensor_constants_made_in_forward_are_captured_with_their_values_and_emitted_as_literals(tmp_path):
    """Traced on the meta device such constants have no value: capture traces again on the CPU,
    the forward writes them as literals made once per device; a constant too large for a literal
    is a capture error (on which optimize emits the original forward)."""
    from kernelwright.capture import capture

    path = tmp_path / "constants.py"
    path.write_text(CONSTANTS.replace("{n}", "6").replace("{half}", "3"))
    problem = load_problem(path)
    graph = capture(problem)
    consts = [i for i in graph.inputs if i.kind == "constant"]
    assert len(consts) == 4 and not any(graph.exported.constants[i.fqn].is_meta for i in consts)
    out = tmp_path / "out"
    result = optimize_problem(problem, out, Options(device="cpu", budget_trials=2, db_path=str(tmp_path / "db.jsonl"),
                                                    log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    text = (out / "model_new.py").read_text()
    assert "_rt.constant('c_lifted_tensor_1', [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], torch.float32, _dev)" in text
    assert "float('inf')" in text and "torch.int64" in text
    mod = import_model_new(out / "model_new.py")
    new = mod.ModelNew(*problem.get_init_inputs())
    ref = problem.make_model("cpu")
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(5)[0]
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x))
        new(x)
    assert len(mod._rt._CONSTANTS) == 4  # made once per device, then reused

    big = tmp_path / "big.py"
    big.write_text(CONSTANTS.replace("{n}", "5000").replace("{half}", "2500").replace("torch.randn(4,", "torch.randn(1,"))
    from kernelwright.capture.export import CaptureError

    with pytest.raises(CaptureError, match="constants up to 4096 elements"):
        capture(load_problem(big))


def test_a_generated_program_that_fails_verification_ships_the_original_forward(tmp_path, monkeypatch):
    """A generated forward that is wrong as a whole (here: its input shifted by 1e-3 before the
    kernels, which each unit's own checks cannot see) fails verification; optimize then writes the
    original forward, verifies that, and keeps the failure on record in result.json and report.md
    rather than shipping a module that is wrong."""
    from kernelwright import pipeline

    render = pipeline.render_model_new

    def wrong(problem, forwards, *args, **kwargs):
        text = render(problem, forwards, *args, **kwargs)
        return text.replace("def _kw_forward_any(self, x):\n", "def _kw_forward_any(self, x):\n    x = x + 1e-3\n")

    monkeypatch.setattr(pipeline, "render_model_new", wrong)
    out, result = _optimize("relu", tmp_path)
    failed = result["verify_fallback"]
    assert not failed["passed"] and failed["failed_check"] == "excess"
    assert result["verify"]["passed"] and result["verify"]["excess"] <= 0.0
    text = (out / "model_new.py").read_text()
    assert "original forward kept" in text and "x = x + 1e-3" not in text and [p.name for p in (out / "kernels").glob("*.py")] == ["_runtime.py"]
    assert "FAILED verification" in (out / "report.md").read_text()
    assert json.loads((out / "result.json").read_text())["verify_fallback"]["failed_check"] == "excess"


def test_a_forward_that_writes_into_its_input_is_kept_as_it_is(tmp_path):
    """x.relu_() on the caller's tensor: the capture refuses it (the emitted forward writes buffers
    only); optimize then keeps the original forward: a KernelBench file's ModelNew verifies (it may
    mutate what eager mutates), and a live module is handed back with its own forward, nothing to
    verify (before, verification flagged that forward for calling the reference and the Python API
    raised)."""
    from kernelwright.capture import CaptureError, capture
    from kernelwright.problem import from_module

    class InPlace(torch.nn.Module):
        def forward(self, x):
            x.relu_()
            return x * 2.0

    problem = from_module(InPlace(), [torch.randn(4, 16)])
    with pytest.raises(CaptureError, match="writes into x in place"):
        capture(problem)
    opts = Options(device="cpu", budget_trials=2, db_path=str(tmp_path / "db.jsonl"), log=lambda s: None)
    result = optimize_problem(problem, tmp_path / "live", opts)
    assert "writes into x in place" in result["capture"] and result["verify"]["passed"]
    assert "nothing generated" in result["verify"]["skipped"] and "verify_fallback" not in result
    assert "verification: not needed" in (tmp_path / "live" / "report.md").read_text()
    import kernelwright

    model, x = InPlace(), torch.randn(4, 16)
    fast = kernelwright.optimize(model, [x], str(tmp_path / "api"), budget_trials=2, db_path=str(tmp_path / "db.jsonl"))
    want = torch.relu(x) * 2.0
    assert fast is model and torch.equal(fast(x), want) and torch.equal(x, torch.relu(x))

    path = tmp_path / "inplace.py"
    path.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        x.relu_()\n"
                    "        return x * 2.0\n\n\ndef get_inputs():\n    return [torch.randn(4, 16)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    result = optimize_problem(load_problem(path), tmp_path / "file", opts)
    assert "writes into x in place" in result["capture"] and result["verify"]["passed"]
    assert "skipped" not in result["verify"] and result["verify"]["excess"] <= 0.0


def test_a_model_that_fails_under_the_policys_autocast_is_a_one_line_problem_error(tmp_path):
    """bf16 runs eager under autocast; a model the device's library cannot run that way (oneDNN's
    LSTM on the CPU) is the user's problem, said in one line before anything is written."""
    from kernelwright.errors import ProblemError
    from kernelwright.problem import from_module

    class NoBf16(torch.nn.Module):
        def forward(self, x):
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("could not create a primitive descriptor\nsecond line")
            return x * 2.0

    problem = from_module(NoBf16(), [torch.randn(4, 8)])
    opts = Options(device="cpu", budget_trials=2, precision="bf16", db_path=str(tmp_path / "db.jsonl"), log=lambda s: None)
    with pytest.raises(ProblemError, match="fails under the bf16 policy's autocast on cpu: RuntimeError: could not") as e:
        optimize_problem(problem, tmp_path / "out", opts)
    assert "second line" not in str(e.value) and not (tmp_path / "out").exists()
    result = optimize_problem(problem, tmp_path / "fp32", Options(device="cpu", budget_trials=2, db_path=str(tmp_path / "db.jsonl"),
                                                                  log=lambda s: None))
    assert result["verify"]["passed"]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_llama_layer_optimizes_with_its_rotary_embedding_in_two_kernels(tmp_path, precision):
    """The Llama decoder layer of the suite (small sizes): verified; each rotary embedding is two
    elementwise kernels writing the halves of its result (no negation, copy or sum over a joined
    tensor), and under bf16 no float32 copy feeds the attention."""
    problem = load_problem(ROOT / "problems" / "level3" / "llama_block.py", small=True)
    result = optimize_problem(problem, tmp_path / "out", Options(device="cpu", budget_trials=2, precision=precision,
                                                               db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"]
    units = [line for line in (tmp_path / "out" / "model_new.py").read_text().splitlines() if line.startswith("#   ")]
    halves = [u for u in units if "[pointwise]" in u and u.count("mul") == 2 and "add" in u]
    assert len(halves) == 4, units  # q's and k's two halves
    assert sum(" neg" in u for u in halves) == 2 and not any(u.split(":")[0].endswith("neg") for u in units)
    assert sum("in place (its own buffer" in u for u in units) == 2
    if precision == "bf16":
        assert not any("clone" in u and "bf16" not in u for u in units if "library (aten.clone" in u)
