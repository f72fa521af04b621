"""End to end on the CPU for recurrent problems: optimize with no_library ships the persistent RNN
kernel (codegen/triton_rnn.py), verified in the Triton interpreter; a recurrent layer without dropout
computes the same in both training modes, so one generated forward serves both, and the emitted
ModelNew answers train- and eval-mode calls with it."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from kernelwright.emit.module import import_model_new
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.problem import load_problem

pytestmark = pytest.mark.interpreter

LEVEL3 = Path(__file__).resolve().parents[2] / "problems" / "level3"


@pytest.mark.parametrize("name", ["gru_bidirectional", "lstm_cn", "lstm_bidirectional"])
def test_no_library_ships_the_persistent_rnn_kernel(name, tmp_path):
    problem = load_problem(LEVEL3 / f"{name}.py", small=True)
    out = tmp_path / "out"
    result = optimize_problem(problem, out, Options(device="cpu", budget_trials=1, small=True, no_library=True,
                                                    db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert set(result["modes"]) == {"any"}
    for mode, r in result["modes"].items():
        assert r["verify"]["passed"] and "verify_fallback" not in r, (mode, r["verify"])
        rnn = [g for g in r["groups"] if g["ops"] in (["gru"], ["lstm"])]
        assert rnn and all(g["strategy"] == "triton" and g["config"]["DOT"] in ("fma", "ieee") for g in rnn), r["groups"]
    kernels = [p.read_text() for p in (out / "kernels").glob("*.py") if not p.name.startswith("_")]
    assert any("_rnn_kernel" in k and 'sem="release"' in k for k in kernels)

    mod = import_model_new(out / "model_new.py")
    for training in (True, False):
        ref = problem.in_mode(training).make_model()
        new = mod.ModelNew(*problem.get_init_inputs())
        new.load_state_dict(ref.state_dict())
        new.train(training)
        x = problem.make_inputs(7)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            want, got = ref(*x), new(*x)
        assert [str(w.message) for w in caught if "kernelwright" in str(w.message)] == []  # no fallback
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
