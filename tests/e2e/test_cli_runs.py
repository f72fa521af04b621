"""The command line end to end: optimize runs of a shipped problem (Triton interpreter) followed by
report, --single-file output run without kernelwright installed, --backend cuda on a machine without
a GPU, and the entry point `python -m kernelwright` in a process of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELU = ROOT / "problems" / "level1" / "relu.py"


def no_staging_left(folder: Path):
    left = [p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name]
    assert not left, left


def test_the_entry_point_gives_bad_input_one_line_and_exit_code_2():
    """`python -m kernelwright` in a process of its own: a problem whose forward raises is one line
    on stderr and exit code 2. Only a real process's stderr shows what libraries print beside it
    (torch.export's fake-tensor logger writes a multi-line ERROR log if a failing forward is captured
    before Problem.check() has run)."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    path = ROOT / "tests" / "fixtures" / "bad" / "forward_raises.py"
    p = subprocess.run([sys.executable, "-m", "kernelwright", "inspect", str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stdout, p.stderr)
    assert lines[0].startswith("kernelwright: error: ") and path.name in lines[0], lines[0]
    assert "Traceback" not in p.stderr + p.stdout and p.stdout == ""


@pytest.mark.interpreter
def test_optimize_then_report(run, tmp_path):
    out = tmp_path / "run"
    p = run("optimize", RELU, "--small", "--device", "cpu", "--budget", "2", "--out", out, "--db", tmp_path / "db.jsonl")
    assert p.returncode == 0, p.stderr
    assert "model_new.py" in p.stdout
    for f in ("model_new.py", "report.md", "result.json"):
        assert (out / f).is_file(), f
        assert ".partial-" not in (out / f).read_text(), f
    assert list((out / "kernels").glob("*.py"))
    result = json.loads((out / "result.json").read_text())
    assert result["verify"]["passed"]
    assert result["device"] == "cpu"
    no_staging_left(tmp_path)

    r = run("report", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "relu" in r.stdout
    assert r.stdout.strip() == (out / "report.md").read_text().strip()


@pytest.mark.interpreter
def test_single_file_embeds_the_kernels_and_their_runtime(run, tmp_path):
    out = tmp_path / "o"
    p = run("optimize", RELU, "--small", "--device", "cpu", "--budget", "1", "--out", out, "--single-file",
            "--db", tmp_path / "db.jsonl")
    assert p.returncode == 0, p.stderr
    assert not (out / "kernels").exists()
    text = (out / "model_new.py").read_text()
    assert '"_runtime": ' in text and '"g0": ' in text and "class ModelNew(Model)" in text
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    check = ("import sys, torch; ns = {'__name__': 'harness'}; exec(open('model_new.py').read(), ns); "
             "x = torch.randn(*ns['get_inputs']()[0].shape); new = ns['ModelNew'](); "
             "torch.testing.assert_close(new(x), torch.relu(x)); "
             "assert 'kernelwright' not in {k.split('.')[0] for k in sys.modules}; print('OK')")
    r = subprocess.run([sys.executable, "-c", check], cwd=out, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_backend_cuda_without_a_gpu_keeps_the_library_and_says_why(run, tmp_path):
    out = tmp_path / "o"
    p = run("optimize", ROOT / "problems" / "level1" / "softmax.py", "--small", "--backend", "cuda",
            "--device", "cpu", "--budget", "2", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "CUDA C++ candidates run only on a GPU" in (out / "report.md").read_text()
    assert [p.name for p in (out / "kernels").glob("*.py")] == ["_runtime.py"]  # no kernel, the runtime
