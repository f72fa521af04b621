"""The fuzzer's oracle on the torch.compile backend (`fuzz --backend`), and programs the fuzzer
found: a gradient that is rounding noise in eager too, a view the emitted forward could not take.
(Apart from tests/e2e/test_fuzz.py so that the two files run on separate workers.)"""
from pathlib import Path

import pytest
import torch

from kernelwright.fuzz import generate as gen

FIX = Path(__file__).parents[1] / "fixtures" / "fuzz"


def _write(seed, folder: Path) -> Path:
    path = folder / f"fuzz_{seed:05d}.py"
    path.write_text(gen.draw(seed).text)
    return path


def _check_text(tmp_path, text: str, precision: str = "fp32"):
    """The oracle's checks (CPU, one trial) of the program `text`, its module under tmp_path/out."""
    from kernelwright.fuzz.oracle import check

    path = tmp_path / "program.py"
    path.write_text(text)
    return check(path, "cpu", precision, 1, work=tmp_path / "out")


@pytest.mark.interpreter
def test_with_backend_the_checks_call_the_model_compiled_with_the_kernelwright_backend(monkeypatch, tmp_path):
    """--backend: every check runs on the model compiled with torch.compile(backend="kernelwright")
    (its graphs optimised by the backend: inference graphs, and AOTAutograd's forward and backward
    graphs for the gradient check), and passes on a fixture with batch norm; a backend whose
    graphs return a value off by 0.1 is caught by every check that compares values."""
    from kernelwright import backend as kwb
    from kernelwright.fuzz.oracle import check

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    graphs = []
    real = kwb._optimised

    def counted(gm, *a, **k):
        graphs.append(sum(1 for n in gm.graph.nodes if n.op == "placeholder" and str(n.target).startswith("tangents")))
        return real(gm, *a, **k)
    monkeypatch.setattr(kwb, "_optimised", counted)
    outcome = check(FIX / "bn_eval_running_stats.py", "cpu", "fp32", 1, backend=True)
    assert outcome.status in ("ok", "kept") and not outcome.wrong, outcome
    assert [c.name for c in outcome.checks] == ["train", "buffers", "eval", "batch", "grad", "double"]
    assert all(c.status in ("ok", "skipped") for c in outcome.checks), outcome.checks
    assert graphs and any(graphs)  # inference graphs, and a backward graph for the gradient check

    def offset(gm, *a, **k):
        run = real(gm, *a, **k)
        return lambda *xs: tuple(o + 0.1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                                 for o in run(*xs))
    monkeypatch.setattr(kwb, "_optimised", offset)
    outcome = check(_write(2, tmp_path), "cpu", "fp32", 1, backend=True)
    checks = {c.name: c for c in outcome.checks}
    assert outcome.status == "wrong"
    assert all(checks[n].status == "wrong" for n in ("train", "eval", "batch", "grad", "double")), checks


BIAS_UNDER_A_NORM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.convt = nn.ConvTranspose2d(3, 5, kernel_size=1, stride=2, output_padding=1)
        self.ln = nn.LayerNorm([26], elementwise_affine=False)

    def forward(self, x):
        return torch.erf(self.ln(self.ln(self.convt(x)) * 2.0))


def get_inputs():
    return [torch.randn(3, 3, 16, 13)]


def get_init_inputs():
    return []
"""


@pytest.mark.interpreter
def test_a_gradient_that_is_rounding_noise_in_eager_too_is_judged_against_float64(monkeypatch, tmp_path):
    """fp32: a transposed convolution's bias under a layer norm over its rows, half of which hold
    the bias alone (stride 2): its exact gradient is zero and eager's is rounding noise magnified
    by the norm of constant rows. A gradient off eager's by far more than the tolerance passes when
    it is no farther from the float64 model's than eager is."""
    from kernelwright.fuzz import oracle

    real = oracle._Subject.run_emitted

    def noisy(self, model, inputs):  # the module's bias gradient: eager's noise, drawn afresh
        out = real(self, model, inputs)
        if out.requires_grad:
            model.convt.bias.register_hook(lambda g: g + 0.5 * torch.randn_like(g) * g.abs().max())
        return out
    monkeypatch.setattr(oracle._Subject, "run_emitted", noisy)
    outcome = _check_text(tmp_path, BIAS_UNDER_A_NORM)
    grad = {c.name: c for c in outcome.checks}["grad"]
    assert grad.status == "ok" and "within eager's own error" in grad.detail, grad



ATTENTION_ON_A_TRANSPOSE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(16, 5, bias=False)

    def forward(self, x0):
        h2 = torch.relu(self.fc0(x0).transpose(1, 2))
        q = h2.view(h2.shape[0], 5, 4, 2).transpose(1, 2)
        return (torch.softmax((q @ (q * 0.5).transpose(-2, -1)) / 1.4142135623730951, dim=-1) @ q
                ).transpose(1, 2).reshape(h2.shape)


def get_inputs():
    return [torch.randn(2, 8, 16)]


def get_init_inputs():
    return []
"""


@pytest.mark.interpreter
def test_views_of_values_the_rewrites_lay_out_anew_still_run(tmp_path):
    """Self-attention by hand on a transposed activation, under tf32: the exact rewrites (no-op
    expands dropped, repeated views merged) and the generated kernels hand some views a value in
    another layout than the traced one, on which the recorded view cannot be taken; the emitted
    forward calls views as reshape, so the generated forward ships (with view it raised in
    verification, and the original forward was kept)."""
    outcome = _check_text(tmp_path, ATTENTION_ON_A_TRANSPOSE, precision="tf32")
    assert outcome.status == "ok" and not outcome.kept, outcome
