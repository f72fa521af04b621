"""The differential fuzzer: programs are deterministic per seed and valid in eager; the oracle
passes correct emitted modules and flags wrong ones; the runner's lines and summary; shrinking."""
import copy
import functools
import math
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kernelwright.fuzz import generate as gen
from kernelwright.fuzz import runner
from kernelwright.fuzz.oracle import Check, Outcome, _difference, _judge
from kernelwright.problem import load_problem

FIX = Path(__file__).parents[1] / "fixtures" / "fuzz"
SLICE = [2, 4, 5]  # small programs: a linear chain, a convolution chain, dropout + batch norm in float64
# gen.draw(seed) once per seed for the tests below (a draw runs its program in eager several times);
# programs are frozen, and the tests of determinism draw afresh
_draw = functools.cache(gen.draw)
pytestmark = pytest.mark.xdist_group("fuzz")  # the tests share _draw's programs: one worker


# --- the generator -------------------------------------------------------------------------------

def test_generate_is_deterministic_per_seed():
    assert gen.generate(3) == gen.generate(3)
    assert gen.generate(3) != gen.generate(4)


@pytest.mark.parametrize("seed", range(50))
def test_every_program_loads_and_runs_in_eager(seed, tmp_path):
    text = gen.generate(seed)
    assert text.startswith(f'"""fuzz seed {seed}: ')
    assert re.search(r"^batch_size = [234]$", text, re.M)
    path = tmp_path / f"fuzz_{seed}.py"
    path.write_text(text)
    problem = load_problem(path)
    model = problem.make_model()
    with torch.no_grad():
        out = model(*problem.make_inputs(0))
    assert torch.isfinite(out).all()
    assert gen.spec_of(text) == _draw(seed).spec  # a second draw: the same program


RECURRENT = [dict(kind=k, hidden=5, layers=layers, bidirectional=bd, batch_first=bf, bias=True, output=out)
             for k, out, layers, bd, bf in [("LSTM", "out", 2, True, False), ("LSTM", "c_n", 1, False, True),
                                             ("GRU", "h_n", 2, True, True), ("RNN", "out", 1, False, False),
                                             ("RNN_relu", "h_n", 1, True, True)]]
ATTENTION = [dict(heads=h, module=m, causal=c, bias=True, **({} if m else {"by_hand": by_hand}),
                  **({"score": score} if score else {}))
             for h, m, c, by_hand, score in [(2, True, True, False, None), (1, True, False, False, None),
                                             (4, False, True, False, None), (2, False, False, False, None),
                                             (2, False, True, True, "softmax"), (1, False, False, True, "softmax"),
                                             (2, False, True, True, "relu"), (1, False, False, True, "sigmoid")]]
POSITION = [dict(extra=x, scale=sc) for x, sc in [(0, False), (3, True)]]


@pytest.mark.parametrize("step", [gen.Step("recurrent", a) for a in RECURRENT]
                         + [gen.Step("attention", a) for a in ATTENTION]
                         + [gen.Step("position", a) for a in POSITION], ids=lambda s: s.label)
def test_sequence_anchors_render_programs_that_run_in_eager(step):
    """Recurrent layers (every kind and output form, time- or batch-major), self-attention (the
    module, scaled_dot_product_attention over heads of the value, or the same by hand, causal or
    not, with a softmax, a ReLU or a sigmoid of the scores) and a learned position
    embedding on a [batch, time, features] input, then a layer norm: valid programs at both batch
    sizes, in both training modes."""
    spec = gen.Spec(0, 3, (6, 8), "contiguous", False, (step, gen.Step("layernorm", {"n": 1, "affine": False,
                                                                                         "bias": False})))
    text = gen.render(spec)
    gen.validate(text)
    assert gen.spec_of(text) == spec


JOINS = ([gen.Step("concat", {"dim": d, "with": w, "pick": 0})
          for d, w in [(1, "tanh"), (2, "input"), (3, "earlier"), (1, "branches"), (1, "dense"), (2, "dense"),
                       (1, "conv_branches")]]
         + [gen.Step("glu", {"gate": g}) for g in ("sigmoid", "silu")]
         + [gen.Step("resize", {"kind": k, "pad": 1, "mode": m}) for k, m in [("nearest", "constant"), ("linear", "constant"),
                                                                              ("pad", "reflect"), ("pad", "constant")]])


@pytest.mark.parametrize("step", JOINS, ids=lambda s: s.label)
@pytest.mark.parametrize("dims", [(4, 6, 8), (4, 8)], ids=["2d", "1d"])
def test_joins_splits_and_resizes_render_programs_that_run_in_eager(step, dims):
    """Concatenation (with an earlier value, the value's tanh, a new input, two branches of it, two
    convolutions of it, or a growing feature list), gated halves and resizes (interpolation by 2, padding) after a convolution: valid programs in both modes."""
    conv = gen.Step(f"conv{len(dims) - 1}d", {"out": 4, "k": [3] * (len(dims) - 1), "stride": 1, "padding": 1,
                                              "dilation": 1, "groups": "one", "mult": 1, "bias": True, "mode": "zeros"})
    spec = gen.Spec(0, 2, dims, "contiguous", False, (conv, step))
    text = gen.render(spec)
    gen.validate(text)
    assert gen.spec_of(text) == spec


def test_tensors_stay_small():
    for seed in range(50):
        spec = _draw(seed).spec
        per_sample = max(math.prod(dims) for _, dims in gen.build(spec).values)
        assert per_sample * gen.second_batch_size(spec.batch) <= 50_000


def test_a_recorded_chain_renders_again_with_fewer_steps():
    spec = _draw(5).spec
    shorter = gen.Spec(spec.seed, spec.batch, spec.dims, spec.layout, spec.double, spec.steps[:1])
    text = gen.render(shorter)
    gen.validate(text)
    assert gen.spec_of(text) == shorter


def test_the_batch_size_global_draws_the_inputs():
    module = gen.load_text(_draw(7).text)
    module.batch_size = 5
    assert all(x.shape[0] == 5 for x in module.get_inputs() if x.dim() >= 3)


def test_generated_programs_cover_the_zoo():
    programs = [_draw(s) for s in range(120)]
    ops = {step.op for p in programs for step in p.spec.steps}
    assert {"conv2d", "conv3d", "linear", "batchnorm", "dropout", "branch", "residual", "reduce"} <= ops
    assert any(p.spec.double for p in programs) and any(p.spec.layout != "contiguous" for p in programs)
    assert any("if self.training:" in p.text for p in programs)


# --- comparisons ---------------------------------------------------------------------------------

def test_difference_reports_error_dtype_and_shape():
    a = torch.ones(3, 4)
    assert _difference(a + 1e-6, a, 1e-4) is None
    error, what = _difference(a + 0.1, a, 1e-4)
    assert error == pytest.approx(0.1, rel=1e-5) and "max error" in what
    assert "dtype" in _difference(a, a.double(), 1e-4)[1]
    assert "shape" in _difference(a[:2], a, 1e-4)[1]
    assert _difference(a + 5, a, 1e-4, values=False) is None


class _Quiet:
    """A stand-in for the oracle's subject: no warnings from the emitted module."""

    def notes(self):
        return ""


def test_reduced_precision_results_are_held_to_eagers_own_error():
    exact = torch.linspace(-2, 2, 50, dtype=torch.float64)
    eager = (exact + 0.05).float()  # eager's own rounding
    assert _judge("train", _Quiet(), (exact - 0.04).float(), eager, 1e-2, exact=exact).status == "ok"
    wrong = _judge("train", _Quiet(), (exact + 0.3).float(), eager, 1e-2, exact=exact)
    assert wrong.status == "wrong" and "from float64: 0.3" in wrong.detail
    assert _judge("train", _Quiet(), (exact - 0.04).float(), eager, 1e-2).status == "wrong"  # no yardstick given
    made = []
    lazily = _judge("train", _Quiet(), eager, eager, 1e-2, exact=lambda: made.append(1) or exact)
    assert lazily.status == "ok" and not made  # the float64 run is made only for a result that is off


# --- the oracle, end to end (Triton interpreter) --------------------------------------------------

def _write(seed, folder: Path) -> Path:
    path = folder / f"fuzz_{seed:05d}.py"
    path.write_text(_draw(seed).text)
    return path


@pytest.mark.interpreter
@pytest.mark.parametrize("seed", SLICE)
def test_the_oracle_passes_a_fixed_slice(seed, tmp_path):
    from kernelwright.fuzz.oracle import check

    outcome = check(_write(seed, tmp_path), "cpu", "fp32", 2)
    assert outcome.status in ("ok", "kept"), outcome
    assert [c.name for c in outcome.checks] == ["train", "buffers", "eval", "batch", "grad", "double"]
    assert all(c.status in ("ok", "skipped", "refused") for c in outcome.checks), outcome.checks


@pytest.mark.interpreter
@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.py")))
def test_no_check_is_wrong_on_the_fixtures(name):
    from kernelwright.fuzz.oracle import check

    outcome = check(FIX / name, "cpu", "fp32", 2)
    assert outcome.status in ("ok", "kept") and not outcome.wrong, outcome


def _patched_import(monkeypatch, wrap):
    """Make the oracle see emitted modules whose ModelNew.forward is wrap(original forward)."""
    from kernelwright.fuzz import oracle

    real = oracle.import_model_new

    def patched(path):
        mod = real(path)
        mod.ModelNew.forward = wrap(mod.ModelNew.forward)
        return mod

    monkeypatch.setattr(oracle, "import_model_new", patched)


def _batch_statistics_in_eval(forward):
    def wrong(self, *args):
        norms = [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if self.training or not norms:
            return forward(self, *args)
        for m in norms:
            m.train()
        try:
            return forward(self, *args)
        finally:
            for m in norms:
                m.eval()
    return wrong


@pytest.mark.interpreter
def test_the_oracle_flags_batch_statistics_in_eval(monkeypatch):
    from kernelwright.fuzz.oracle import check

    _patched_import(monkeypatch, _batch_statistics_in_eval)
    outcome = check(FIX / "bn_eval_running_stats.py", "cpu", "fp32", 2)
    checks = {c.name: c for c in outcome.checks}
    assert outcome.status == "wrong" and outcome.reason.startswith("eval:")
    assert checks["eval"].status == "wrong" and checks["eval"].error >= 0.1
    assert checks["train"].status == "ok" and checks["grad"].status == "ok"


@pytest.mark.interpreter
def test_the_oracle_flags_an_offset_output(monkeypatch, tmp_path):
    from kernelwright.fuzz.oracle import check

    _patched_import(monkeypatch, lambda forward: lambda self, *a: forward(self, *a) + 0.1)
    outcome = check(_write(2, tmp_path), "cpu", "fp32", 2)
    checks = {c.name: c for c in outcome.checks}
    assert outcome.status == "wrong"
    assert all(checks[n].status == "wrong" for n in ("train", "eval", "batch", "grad", "double"))
    assert checks["train"].error == pytest.approx(0.1, rel=1e-3)


@pytest.mark.interpreter
def test_shrink_keeps_the_failing_check_with_fewer_steps(monkeypatch, tmp_path):
    from kernelwright.fuzz.shrink import shrink

    _patched_import(monkeypatch, lambda forward: lambda self, *a: forward(self, *a) + (0 if self.training else 0.1))
    seed = next(s for s in range(100) if len(_draw(s).spec.steps) == 3 and not _draw(s).spec.double
                and _draw(s).spec.layout == "contiguous")
    path = _write(seed, tmp_path)
    text = shrink(path)
    assert len(gen.spec_of(text).steps) == 1
    assert "Checks the emitted module's `eval` call" in text
    assert (tmp_path / f"{path.stem}_min.py").read_text() == text


# --- the runner ----------------------------------------------------------------------------------

def test_the_summary_line_has_the_exact_format():
    results = [runner.Result(i, "a+b", Outcome("p", status), 1.0)
               for i, status in enumerate(["ok", "wrong", "failed", "kept", "kept", "ok"])]
    assert runner.Summary(results).line == "fuzz: 6 programs, 1 wrong, 1 failed to optimize, 2 kept original"


def test_run_prints_a_line_per_program_and_survives_the_oracle(monkeypatch, tmp_path):
    statuses = iter(["ok", "wrong", "raise", "kept"])

    def fake_check(path, device, precision, budget, work=None, no_library=False, backend=False):
        status = next(statuses)
        if status == "raise":
            raise RuntimeError("oracle bug\nsecond line")
        checks = [Check("eval", "wrong", 0.5, "max error 0.5")] if status == "wrong" else []
        return Outcome(str(path), status, checks, reason="eval: max error 0.5" if status == "wrong" else "")

    monkeypatch.setattr(runner, "check", fake_check)
    lines = []
    summary = runner.run(4, 10, "cpu", "fp32", tmp_path, 2, log=lines.append)
    assert lines[-1] == "fuzz: 4 programs, 1 wrong, 1 failed to optimize, 1 kept original"
    assert re.match(r"fuzz  10 ok      \S+  \(\d+\.\d s\)$", lines[0])
    assert lines[1].startswith("fuzz  11 wrong   ") and "eval: max error 0.5" in lines[1]
    assert "oracle raised RuntimeError: oracle bug" in lines[2] and summary.results[2].outcome.status == "failed"
    assert (tmp_path / "wrong" / "fuzz_00011.py").exists() and (tmp_path / "wrong" / "fuzz_00011.json").exists()
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 4


def test_ctrl_c_ends_the_run_with_the_summary_so_far(monkeypatch, tmp_path):
    calls = []

    def fake_check(path, device, precision, budget, work=None, no_library=False, backend=False):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return Outcome(str(path), "ok")

    monkeypatch.setattr(runner, "check", fake_check)
    lines = []
    summary = runner.run(10, 0, "cpu", "fp32", tmp_path, 2, log=lines.append)
    assert summary.interrupted and len(summary.results) == 2
    assert lines[-1] == "fuzz: 2 programs, 0 wrong, 0 failed to optimize, 0 kept original"


def test_the_command_exits_1_when_a_program_is_wrong(monkeypatch, tmp_path):
    import typer
    from typer.testing import CliRunner

    from kernelwright.fuzz.command import fuzz

    def fake_run(count, seed, device, precision, out, budget, log, no_library=False, backend=False):
        log("fuzz: 1 programs, 1 wrong, 0 failed to optimize, 0 kept original")
        return runner.Summary([runner.Result(0, "x", Outcome("p", "wrong"), 0.1)])

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    app = typer.Typer()
    app.command()(fuzz)
    result = CliRunner().invoke(app, ["--count", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "1 wrong" in result.output
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_given_files_the_command_checks_them_and_applies_small_where_defined(tmp_path):
    """`kernelwright fuzz PATH... --small` runs the oracle on existing problems: a shipped problem
    at its SMALL sizes, a fixture (no SMALL) as it is."""
    import typer
    from typer.testing import CliRunner

    from kernelwright.fuzz.command import fuzz

    root = Path(__file__).resolve().parents[2]
    app = typer.Typer()
    app.command()(fuzz)
    result = CliRunner().invoke(app, [str(root / "problems" / "level1" / "relu.py"),
                                      str(root / "tests" / "fixtures" / "modes" / "ema_buffer.py"),
                                      "--small", "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("fuzz ")]
    assert "relu" in lines[0] and "ema_buffer" in lines[1] and " ok " in lines[0]
    assert result.output.strip().endswith("fuzz: 2 programs, 0 wrong, 0 failed to optimize, 0 kept original")


def _check_text(tmp_path, text: str, no_library: bool = False, precision: str = "fp32"):
    """The oracle's checks (CPU, one trial) of the program `text`, its module under tmp_path/out."""
    from kernelwright.fuzz.oracle import check

    path = tmp_path / "program.py"
    path.write_text(text)
    return check(path, "cpu", precision, 1, work=tmp_path / "out", no_library=no_library)


CLOSURE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        m = self
        self.mlp = lambda x: m.out(torch.tanh(m.fc(x)))  # (as MinGPT's block builds its MLP)

    def forward(self, x):
        return self.mlp(x)


batch_size = 3


def get_inputs():
    return [torch.randn(batch_size, 8)]


def get_init_inputs():
    return []
"""


def test_a_model_whose_float64_copy_cannot_run_is_judged_against_eager_alone(tmp_path):
    """Under tf32 the oracle also measures against a float64 copy of the model; a forward that
    reaches the original float32 modules through a closure cannot run as that copy: the checks
    compare with eager alone instead of the oracle failing."""
    outcome = _check_text(tmp_path, CLOSURE, precision="tf32")
    assert outcome.status == "ok", outcome


ILL_CONDITIONED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x + 1e4)  # float32 keeps ~1e-3 of each value; the norm over two values magnifies it


def get_inputs():
    return [torch.randn(2, 4) * 1e-3]


def get_init_inputs():
    return []
"""


def _in_float64(forward):
    """A forward computed on a float64 copy of the module (its buffers copied back): more accurate
    than eager's float32, hence off eager's result by more than fp32's tolerance here."""
    def exact(self, x):
        if not self.training:
            return forward(self, x)
        twin = copy.deepcopy(self).double()
        out = forward(twin, x.double())
        with torch.no_grad():
            for b, b64 in zip(self.buffers(), twin.buffers()):
                b.copy_(b64)
        return out.float()
    return exact


def _in_float64_with_gradients(forward):
    """`_in_float64` with the module's own parameters (cast to float64 where they are read), so
    gradients reach them."""
    from torch.nn.utils.stateless import _reparametrize_module

    def exact(self, x):
        if not self.training:
            return forward(self, x)
        wide = {n: p.double() for n, p in self.named_parameters()}
        buffers = {n: b.double() if b.is_floating_point() else b.clone() for n, b in self.named_buffers()}
        with _reparametrize_module(self, {**wide, **buffers}):
            out = forward(self, x.double())
        with torch.no_grad():
            for n, b in self.named_buffers():
                b.copy_(buffers[n])
        return out.float()
    return exact


@pytest.mark.interpreter
def test_under_fp32_an_ill_conditioned_model_is_judged_against_float64(monkeypatch, tmp_path):
    """fp32, a batch norm over two values of 1e4 + 1e-3 * noise: eager's own float32 result is far
    from the float64 one, and a module computing in float64 is off eager by far more than the
    tolerance, yet passes (no farther from float64 than eager); an offset output still fails."""
    _patched_import(monkeypatch, _in_float64)
    outcome = _check_text(tmp_path, ILL_CONDITIONED)
    checks = {c.name: c for c in outcome.checks}
    assert checks["train"].status == "ok" and "within eager's own error" in checks["train"].detail, checks["train"]
    assert checks["buffers"].status == "ok"
    _patched_import(monkeypatch, lambda forward: lambda self, x: _in_float64(forward)(self, x) + 0.5)
    (tmp_path / "off").mkdir()
    off = {c.name: c for c in _check_text(tmp_path / "off", ILL_CONDITIONED).checks}
    assert off["train"].status == "wrong" and "from float64" in off["train"].detail


@pytest.mark.interpreter
def test_the_gradient_checks_outputs_are_judged_against_float64_too(monkeypatch, tmp_path):
    """The gradient check compares the outputs of its call before the gradients: a module computing
    the ill-conditioned batch norm in float64 (its parameters' gradients flowing) is off eager's
    float32 output by more than the tolerance there too, and passes as in the train check."""
    _patched_import(monkeypatch, _in_float64_with_gradients)
    grad = {c.name: c for c in _check_text(tmp_path, ILL_CONDITIONED).checks}["grad"]
    assert grad.status == "ok" and "within eager's own error" in grad.detail.split(";")[0], grad


CONV_POOL = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return F.hardswish(F.max_pool2d(torch.tanh(self.conv(x)), 2) + 0.5)


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
"""


@pytest.mark.interpreter
def test_no_library_puts_the_generated_convolution_through_every_check(tmp_path):
    """With no_library the oracle's checks (train and eval, another batch size, gradients, float64)
    run on the module whose convolution, tanh, pool and hardswish are one generated kernel."""
    outcome = _check_text(tmp_path, CONV_POOL, no_library=True)
    assert outcome.status == "ok", outcome
    kernels = [k.read_text() for k in (tmp_path / "out" / "kernels").glob("*.py")]
    assert any("max-pooled over [2, 2]" in k for k in kernels)


def test_the_no_library_and_backend_flags_reach_the_oracle(monkeypatch, tmp_path):
    seen = []

    def fake_check(path, device, precision, budget, work=None, small=False, no_library=False, backend=False):
        seen.append((no_library, backend))
        return Outcome(str(path), "ok")

    monkeypatch.setattr(runner, "check", fake_check)
    runner.run(2, 0, "cpu", "fp32", tmp_path, 1, log=lambda s: None, no_library=True)
    runner.run(1, 0, "cpu", "fp32", tmp_path, 1, log=lambda s: None, backend=True)
    runner.run_files([FIX / "bn_eval_running_stats.py"], "cpu", "fp32", tmp_path, 1, log=lambda s: None, backend=True)
    assert seen == [(True, False), (True, False), (False, True), (False, True)]



STATEFUL = """import torch
import torch.nn as nn

batch_size = 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.h0 = torch.randn(batch_size, 5)  # a state made for one batch size, as some KernelBench RNNs hold

    def forward(self, x):
        return torch.tanh(x + self.h0)


def get_inputs():
    return [torch.randn(batch_size, 5)]


def get_init_inputs():
    return []
"""


def test_a_tensor_attribute_is_read_from_the_live_module(tmp_path):
    """A plain tensor attribute (an initial state made in __init__) is read from the module at each
    call, not frozen at the value the optimized model had: every check passes (the other batch size
    too, its ModelNew given the reference's attribute), the generated forward follows a replaced
    attribute, and one of another size runs the original forward."""
    from kernelwright.emit.module import import_model_new

    outcome = _check_text(tmp_path, STATEFUL)
    assert outcome.status == "ok" and all(c.status in ("ok", "skipped") for c in outcome.checks), outcome
    mod = import_model_new(str(tmp_path / "out" / "model_new.py"))
    new, x = mod.ModelNew(), torch.randn(3, 5)
    with torch.no_grad():
        new.h0 = torch.randn(3, 5)
        torch.testing.assert_close(new(x), torch.tanh(x + new.h0))
        assert not mod._KW_WARNED
        new.h0 = torch.randn(1, 5)
        torch.testing.assert_close(new(x), torch.tanh(x + new.h0))
    assert any("tensor attribute" in w for w in mod._KW_WARNED)


FIXED_BATCH = """import torch
import torch.nn as nn

batch_size = 3


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x.reshape(3, 5))


def get_inputs():
    return [torch.randn(batch_size, 5)]


def get_init_inputs():
    return []
"""


def test_a_model_that_fails_at_another_batch_size_skips_that_check(tmp_path):
    """When the model itself cannot run at the second batch size, the batch check is skipped and
    says why; the other checks decide the outcome."""
    outcome = _check_text(tmp_path, FIXED_BATCH)
    assert outcome.status == "ok", outcome
    (batch,) = [c for c in outcome.checks if c.name == "batch"]
    assert batch.status == "skipped" and "the model itself fails" in batch.detail


SCALAR = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, s):
        return torch.relu(A * s + 1.0)


batch_size = 4


def get_inputs():
    return [torch.randn(batch_size, 6), 3.5]


def get_init_inputs():
    return []
"""


def test_a_number_input_specialises_the_forward(tmp_path):
    """A number passed as an input (KernelBench's matrix-scalar problem) is captured as the value
    the graph is specialised for: the checks pass, the generated forward runs for that number and
    the original forward for any other."""
    from kernelwright.emit.module import import_model_new

    outcome = _check_text(tmp_path, SCALAR)
    assert outcome.status == "ok" and not outcome.kept, outcome
    mod = import_model_new(str(tmp_path / "out" / "model_new.py"))
    new, a = mod.ModelNew(), torch.randn(4, 6)
    torch.testing.assert_close(new(a, 3.5), torch.relu(a * 3.5 + 1.0))
    assert not mod._KW_WARNED
    torch.testing.assert_close(new(a, 2.0), torch.relu(a * 2.0 + 1.0))
    assert any("specialised for 3.5" in w for w in mod._KW_WARNED)


INPLACE_BACKWARD = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        out = torch.relu(self.lin(x))
        out += x  # (ShuffleNet's unit adds its shortcut so: eager's own backward then raises)
        return out


batch_size = 3


def get_inputs():
    return [torch.randn(batch_size, 5)]


def get_init_inputs():
    return []
"""


def test_a_model_whose_own_backward_raises_skips_the_gradient_check(tmp_path):
    outcome = _check_text(tmp_path, INPLACE_BACKWARD)
    assert outcome.status == "ok", outcome
    (grad,) = [c for c in outcome.checks if c.name == "grad"]
    assert grad.status == "skipped" and "eager's backward raises" in grad.detail


def test_a_large_tensor_attribute_is_an_input_not_a_literal():
    """A plain tensor attribute of any size (a causal mask kept as an attribute) is a graph input
    read from the module, and counts as a weight (computed once per call ahead of the inputs);
    tensors the forward makes from Python data stay literals, up to their size limit."""
    from kernelwright.capture import capture
    from kernelwright.plan.weights import weight_roots
    from kernelwright.problem import from_module

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.mask = torch.tril(torch.ones(80, 80))

        def forward(self, x):
            return x.masked_fill(self.mask == 0, 0.0) * torch.tensor(2.0)

    graph = capture(from_module(Masked(), [torch.randn(2, 80, 80)]))
    kinds = {i.fqn: i.kind for i in graph.inputs if i.kind in ("attribute", "constant")}
    assert kinds.get("mask") == "attribute" and "constant" in kinds.values(), kinds
    assert next(i.name for i in graph.inputs if i.fqn == "mask") in weight_roots(graph)


SPECTRAL = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.utils.spectral_norm(nn.Conv2d(3, 8, 3, padding=1))

    def forward(self, x):
        return F.leaky_relu(self.c(x), 0.2).mean((2, 3))


batch_size = 2


def get_inputs():
    return [torch.randn(batch_size, 3, 6, 6)]


def get_init_inputs():
    return []
"""


def test_an_old_style_spectral_norm_passes_every_check(tmp_path):
    """nn.utils.spectral_norm is a forward pre-hook that runs its power iteration (updating two
    buffers) in training mode only: the module gets a forward per mode (capture.modes reads the
    hook), and the training forward verifies: its normalization goes through an expand that one
    group computes and another reads, specialised for its stride-0 layout, which the group writes."""
    outcome = _check_text(tmp_path, SPECTRAL)
    assert outcome.status == "ok", outcome
    assert "original forward kept" not in (tmp_path / "out" / "model_new.py").read_text()


def test_captured_strides_are_calibrated_against_the_device():
    """calibrate_strides gives the batch norm's result of a transposed input the strides the
    library call returns (contiguous), not the transposed ones of its captured metadata."""
    from kernelwright.capture import capture
    from kernelwright.capture.execute import calibrate_strides

    problem = load_problem(Path(__file__).parents[1] / "fixtures" / "strides" / "bn_transposed_dropout.py")
    graph = capture(problem)
    norm = next(n for n in graph.nodes if "batch_norm" in n.target)
    assert not norm.outs[0].contiguous
    model, inputs = problem.make_model(), problem.make_inputs(0)
    with torch.no_grad():
        changed = calibrate_strides(graph, model, inputs)
        eager = model.bn(inputs[0])
    assert norm.name in changed and norm.outs[0].stride == eager.stride() and norm.outs[0].contiguous


@pytest.mark.interpreter
def test_a_returned_value_keeps_eagers_layout_when_the_convolution_before_it_runs_channels_last():
    """Under tf32 the convolution runs channels-last; the elementwise op after it is what the model
    returns, in eager's contiguous layout (the oracle compares each output's memory order)."""
    from kernelwright.fuzz.oracle import check

    outcome = check(FIX / "conv_output_layout.py", "cpu", "tf32", 2)
    assert outcome.status == "ok" and not outcome.wrong, outcome


def test_a_dropout_after_a_channels_last_convolution_draws_eagers_mask():
    """A dropout reading a convolution's result kept channels-last would draw its mask in another
    memory order (train-mode values unlike eager's: the generated forward fails verification and
    the original is kept); it reads a copy in eager's layout instead, and the forward ships."""
    from kernelwright.fuzz.oracle import check

    outcome = check(FIX / "conv_dropout_layout.py", "cpu", "tf32", 2)
    assert outcome.status == "ok" and not outcome.wrong and not outcome.kept, outcome


def test_the_oracle_compares_memory_order_not_size_one_strides():
    from kernelwright.fuzz.oracle import _difference

    x = torch.randn(2, 3, 4, 5)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert "strides" in _difference(cl, x, 1e-4, layout=True)[1]
    assert _difference(cl, x, 1e-4) is None  # (the checks after `train` compare values only)
    assert _difference(x.clone(), x, 1e-4, layout=True) is None
    col = torch.randn(1, 3, 1, 1)
    assert _difference(col.contiguous(memory_format=torch.channels_last), col, 1e-4, layout=True) is None


def test_dropout_after_a_transposed_batch_norm_ships_and_matches_eager():
    from kernelwright.fuzz.oracle import check

    outcome = check(Path(__file__).parents[1] / "fixtures" / "strides" / "bn_transposed_dropout.py", "cpu", "tf32", 2)
    assert outcome.status == "ok" and not outcome.wrong, outcome
