"""optimize --ncu on a machine without a GPU (Triton interpreter): the run succeeds, says in one
line why there are no counters, and its reports say so; the ncu runner script runs the emitted
module's forward (here on the CPU) and records that the generated forward answered."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelwright.measure import ncu

ROOT = Path(__file__).resolve().parents[2]
RELU = ROOT / "problems" / "level1" / "relu.py"


@pytest.mark.interpreter
def test_optimize_ncu_without_a_gpu_says_so_and_the_runner_calls_the_module(run, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ncu").write_text("#!/bin/sh\nexit 1\n")  # present, but the run has no GPU to profile
    (bin_dir / "ncu").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "run"
    p = run("optimize", RELU, "--small", "--device", "cpu", "--budget", "1", "--out", out, "--quiet", "--ncu",
            "--db", tmp_path / "db.jsonl")
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip().splitlines() == ["kernelwright: Nsight Compute: the run had no CUDA GPU: no kernel counters"]
    result = json.loads((out / "result.json").read_text())
    assert result["ncu"] == {"status": "the run had no CUDA GPU: no kernel counters"}
    assert not any("ncu" in g for g in result["groups"])
    assert "Nsight Compute: the run had no CUDA GPU" in (out / "report.md").read_text()
    assert "Nsight Compute: the run had no CUDA GPU" in (out / "report.html").read_text()

    # the script ncu would run: ModelNew from model_new.py's own problem text, warm-up and profiled calls
    runner, status = tmp_path / "runner.py", tmp_path / "status.json"
    runner.write_text(ncu.RUNNER)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(runner), str(out / "model_new.py"), result["mode"], "fp32", "1", "2",
                           str(status), "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = json.loads(status.read_text())
    assert ran["ok"] and ran["calls"] == 3
    assert ran["warnings"] == []  # no call fell back to the original forward
    units = ncu.kernel_units(ncu.kernel_sources(out), result["groups"])
    assert units and all(owners == [result["groups"][0]["id"]] for owners in units.values())
