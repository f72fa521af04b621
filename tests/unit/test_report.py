"""report.md from result.json: the choices each unit was given, timed alike."""
from kernelwright.emit.report import render_report


def test_each_units_choices_are_listed_with_what_they_measured():
    group = {"id": "g0", "kind": "normalization", "ops": ["softmax"], "strategy": "triton", "config": {"BLOCK_M": 4},
             "time_ms": 0.012, "library_ms": 0.02, "gbps": 100.0, "resources": {}, "excess": 0.0, "eager_excess": 0.0,
             "choices": [{"choice": "library", "time_ms": 0.02, "trials": 0, "failed": 0},
                         {"choice": "triton.row", "time_ms": 0.012, "trials": 6, "failed": 1},
                         {"choice": "cuda.row", "time_ms": None, "trials": 3, "failed": 3}]}
    text = render_report({"problem": "p", "precision": "fp32", "device": "cuda", "capture": "ok", "groups": [group]})
    assert ("- g0: library 0.020 ms; triton.row 0.012 ms (6 trials, 1 failed); "
            "cuda.row no candidate passed (3 trials, 3 failed)") in text


def test_units_without_choices_add_no_section():
    text = render_report({"problem": "p", "precision": "fp32", "device": "cpu", "capture": "ok", "groups": []})
    assert "Choices per unit" not in text
