"""report.html of a CPU optimize run (Triton interpreter): the page says nothing was timed, draws no
chart, and shows the generated kernel."""
from __future__ import annotations

from pathlib import Path

import pytest

from html_page import Page, embedded_only  # tests/html_page.py

ROOT = Path(__file__).resolve().parents[2]
RELU = ROOT / "problems" / "level1" / "relu.py"


@pytest.mark.interpreter
def test_the_page_of_a_cpu_run_says_nothing_was_timed(run, tmp_path):
    out = tmp_path / "run"
    p = run("optimize", RELU, "--small", "--device", "cpu", "--budget", "2", "--out", out, "--db", tmp_path / "db.jsonl")
    assert p.returncode == 0, p.stderr
    assert (out / "report.html").is_file()  # optimize writes the page too
    (out / "report.html").unlink()
    r = run("report", out, "--db", tmp_path / "db.jsonl")
    assert r.returncode == 0, r.stderr
    raw = (out / "report.html").read_text()
    page = Page(raw)
    embedded_only(page, raw)
    assert "svg" not in page.tags and "img" not in page.tags
    assert "Nothing was timed (no CUDA GPU" in page.text
    assert "kernelwright report: relu" in page.text and "PASS" in page.text and "(SMALL shapes)" in page.text
    kernels = sorted(p.name for p in (out / "kernels").glob("*.py") if not p.name.startswith("_"))
    assert kernels and all(f"kernels/{k}" in page.text for k in kernels)
    assert "def launch" in page.text and 'class="hl"' in raw
    import json

    (unit,) = json.loads((out / "result.json").read_text())["groups"]
    assert unit["flops"] > 0 and unit["bytes"] > 0  # what places a timed unit on the roofline
