"""report.md from result.json: the choices each unit was given, timed alike."""
from kernelwright.emit.report import render_report


def test_each_units_choices_are_listed_with_what_they_measured():
    group = {"id": "g0", "kind": "normalization", "ops": ["softmax"], "strategy": "triton", "config": {"BLOCK_M": 4},
             "time_ms": 0.012, "library_ms": 0.02, "gbps": 100.0, "resources": {}, "excess": 0.0, "eager_excess": 0.0,
             "choices": [{"choice": "library", "time_ms": 0.02, "trials": 0, "failed": 0},
                         {"choice": "triton.row", "time_ms": 0.012, "trials": 6, "failed": 1},
                         {"choice": "cuda.row", "time_ms": None, "trials": 3, "failed": 3},
                         {"choice": "triton.conv", "time_ms": None, "trials": 0, "failed": 0, "refused": "no box"}]}
    text = render_report({"problem": "p", "precision": "fp32", "device": "cuda", "capture": "ok", "groups": [group]})
    assert ("- g0: library 0.020 ms; triton.row 0.012 ms (6 trials, 1 failed); "
            "cuda.row no candidate passed (3 trials, 3 failed); triton.conv refused: no box") in text


def test_units_without_choices_add_no_section():
    text = render_report({"problem": "p", "precision": "fp32", "device": "cpu", "capture": "ok", "groups": []})
    assert "Choices per unit" not in text


def test_the_units_left_to_a_library_are_listed_in_one_line():
    """One line names the searched units whose chosen implementation is the library call (with their
    ops), or says there is none."""
    def row(gid, ops, strategy):
        return {"id": gid, "kind": "conv", "ops": ops, "strategy": strategy, "config": {}, "time_ms": 0.1,
                "library_ms": 0.1, "resources": {}, "excess": 0.0, "eager_excess": 0.0}

    def report(*groups):
        return render_report({"problem": "p", "precision": "fp32", "device": "cpu", "capture": "ok",
                              "groups": list(groups)}).splitlines()

    lines = report(row("conv_3", ["aten.convolution"], "library"), row("g1", ["aten.add", "aten.relu"], "triton"),
                   row("g2", ["aten.mul", "aten.tanh"], "library"))
    assert "Library units: conv_3 (aten.convolution), g2 (aten.mul+aten.tanh)" in lines
    assert "Library units: none" in report(row("g1", ["aten.relu"], "triton"), row("g2", ["aten.sum"], "cuda"))
    assert not [ln for ln in report() if ln.startswith("Library units")]  # nothing was searched


def test_units_report_their_tflops_against_the_peak_that_applies():
    """A convolution unit (kind "node": the ops say it is one) against the policy's tensor-core
    peak, in its row and beside each of its choices; a pointwise unit against the FP32 peak."""
    from kernelwright.analyze.device import device_spec

    spec = device_spec()
    conv = {"id": "convolution", "kind": "node", "ops": ["clone", "convolution"], "strategy": "library", "config": {},
            "time_ms": 10.0, "library_ms": 10.0, "flops": 2e12, "resources": {}, "excess": None, "eager_excess": 0.0,
            "choices": [{"choice": "library", "time_ms": 10.0, "trials": 0, "failed": 0},
                        {"choice": "triton.conv", "time_ms": 20.0, "trials": 2, "failed": 0}]}
    pw = {"id": "g1", "kind": "pointwise", "ops": ["relu"], "strategy": "triton", "config": {}, "time_ms": 1.0,
          "library_ms": 2.0, "flops": 1e9, "gbps": 2000.0, "resources": {}, "excess": 0.0, "eager_excess": 0.0}
    text = render_report({"problem": "p", "precision": "tf32", "device": "cuda", "capture": "ok", "groups": [conv, pw]})
    rows = {ln.split(" | ")[0][2:]: ln.split(" | ") for ln in text.splitlines() if ln.startswith("| convolution |")
            or ln.startswith("| g1 |")}
    assert rows["convolution"][9:11] == ["200.0", f"{100 * 200 / spec.peak_tflops('tf32'):.0f}%"]
    assert rows["g1"][9:11] == ["1.0", f"{100 * 1 / spec.fp32_tflops:.0f}%"]
    assert "- convolution: library 10.000 ms, 200.0 TFLOP/s; triton.conv 20.000 ms, 100.0 TFLOP/s (2 trials" in text
