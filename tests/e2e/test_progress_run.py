"""Options.progress through a whole optimize run without a GPU (Triton interpreter): the one
untimed trial of each searched unit is reported with the unit's id."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.interpreter
def test_the_pipeline_reports_each_units_trials(tmp_path):
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.problem import load_problem

    seen, lines = [], []
    p = load_problem(ROOT / "problems" / "level1" / "softmax.py", small=True)
    result = optimize_problem(p, tmp_path / "out", Options(budget_trials=2, device="cpu", small=True,
                                                          db_path=str(tmp_path / "db.jsonl"), log=lines.append,
                                                          progress=seen.append))
    units = [g["id"] for g in result["groups"] if g.get("trials")]
    assert units and [(s.unit, s.done, s.budget) for s in seen] == [(u, 1, 1) for u in units]
    assert all(s.best_ms is None for s in seen)  # nothing is timed without a GPU
    assert any(line.startswith(f"{units[0]} [") for line in lines)  # the per-unit lines are unchanged
