"""optimize on a convolution problem whose spatial mean the exact algebra (plan/algebra.py) takes from
box sums of the input, at the SMALL size in the Triton interpreter: the emitted forward runs no
convolution, agrees with Model (also after the weights are edited: the reduced weights are computed
from the live parameters on every call), result.json counts the FLOPs before and after the
rewrites and report.md lists the rewrite; with no_rewrites the convolution stays."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.problem import load_problem

pytestmark = pytest.mark.interpreter

PROBLEM = Path(__file__).resolve().parents[2] / "problems" / "level2" / "conv3d_mean.py"


def _optimize(tmp_path: Path, **options):
    problem = load_problem(PROBLEM, small=True)
    out = tmp_path / "out"
    result = optimize_problem(problem, out, Options(device="cpu", budget_trials=1, small=True, mode="eval",
                                                    db_path=str(tmp_path / "db.jsonl"), log=lambda s: None, **options))
    assert result["verify"]["passed"], result["verify"]
    return problem, out, result


def test_the_spatial_mean_of_a_convolution_runs_without_it(tmp_path):
    problem, out, result = _optimize(tmp_path)
    a = result["analysis"]
    assert a["flops_after_rewrites"] < a["flops"] / 5, a
    assert json.loads((out / "result.json").read_text())["analysis"]["flops"] == a["flops"]
    assert any("conv_spatial_reduction" in r for r in result["rewrites"])
    assert "| conv_spatial_reduction |" in (out / "report.md").read_text()
    assert "torch.convolution(" not in (out / "model_new.py").read_text()

    reference = problem.make_model()
    new = model_new_like(import_model_new(out / "model_new.py"), problem, reference, "cpu")
    x = problem.make_inputs(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(new(x), reference(x), rtol=1e-4, atol=1e-5)
        for m in (new, reference):  # the same edit on both
            m.conv.weight.mul_(-2.0).add_(0.1)
            m.conv.bias.add_(1.0)
        torch.testing.assert_close(new(x), reference(x), rtol=1e-4, atol=1e-5)


def test_no_rewrites_keeps_the_convolution(tmp_path):
    _, out, result = _optimize(tmp_path, no_rewrites=True)
    assert not any("conv_spatial_reduction" in r for r in result["rewrites"])
    assert result["analysis"]["flops_after_rewrites"] == result["analysis"]["flops"]
    assert "torch.convolution(" in (out / "model_new.py").read_text()
