"""bench.html from the bench JSON's rows and summary: per-level table, fast_p, geometric means and
the speedup distribution, read back with html.parser; bench --report writes it."""
from __future__ import annotations

from pathlib import Path

import torch
from html_page import Page, embedded_only  # tests/html_page.py

from kernelwright import cli
from kernelwright.bench.runner import summarise
from kernelwright.emit.bench_html import render_bench_html, speedups, write_bench_report

RELU = Path(__file__).resolve().parents[2] / "problems" / "level1" / "relu.py"


def row(problem, level, eager, compile_, kw=None, correct=True, **extra) -> dict:
    """A bench row as bench/runner.py writes it (times are medians in ms)."""
    times = {"eager": eager, "compile": compile_}
    if kw is not None:
        times["kernelwright"] = kw
    return {"problem": problem, "path": f"problems/level{level}/{problem}.py", "level": level, "times": times,
            "correct": correct, **extra}


ROWS = [row("relu", 1, 1.0, 0.8, 0.4), row("softmax", 1, 2.0, 1.0, 1.25), row("gemm_softmax", 2, 6.0, 5.0, 2.0),
        row("conv_bn", 2, 3.0, 3.0, 4.0, correct=False), row("bad", 2, 1.0, 1.0, None, correct=False, error="boom")]


def bench(rows, baseline_only=False) -> dict:
    return {"rows": rows, "summary": summarise(rows, baseline_only), "gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
            "options": {"baseline_only": baseline_only, "precision": "tf32", "trials": 12, "compile_mode": "default"}}


def test_the_page_holds_the_level_table_fast_p_and_the_distribution():
    raw = render_bench_html(bench(ROWS))
    page = Page(raw)
    embedded_only(page, raw)
    assert page.tags.get("svg") == 2  # speedups over torch.compile and over eager
    # level 1: kw/compile geomean sqrt(2 * 0.8) = 1.265; both faster than eager, one than compile (50%)
    assert "level1 2 100% 2.000 1.265 100% 50% 50% 0% 1.581" in page.text, page.text
    # level 2: one correct of three (33%), its speedups 3x over eager and 2.5x over compile
    assert "level2 3 33% 3.000 2.500 33% 33% 33% 33%" in page.text
    for text in ("GPU NVIDIA H200", "precision policy tf32", "Level 1", "Level 2",
                 "gemm_softmax 6.000 5.000 2.000 3.00x 2.50x correct", "conv_bn 3.000 3.000 4.000 0.75x 0.75x wrong",
                 "bad 1.000 1.000 - - - error : boom"):
        assert text in page.text, text
    assert "kernelwright over torch.compile: 3 problems" in raw
    assert speedups(ROWS, "compile") == [0.8 / 0.4, 1.0 / 1.25, 5.0 / 2.0]


def test_a_baseline_only_run_draws_no_distribution():
    rows = [dict(row("relu", 1, 1.0, 0.8), correct=None)]
    page = Page(render_bench_html(bench(rows, baseline_only=True)))
    assert "svg" not in page.tags
    assert "No kernelwright times (a baseline-only run)" in page.text and "baselines only" in page.text


def test_bench_report_writes_the_page(run, tmp_path, monkeypatch):
    from kernelwright.bench import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H200")
    monkeypatch.setattr(runner, "run_bench", lambda *a, **kw: (ROWS, summarise(ROWS, False)))
    p = run("bench", RELU, "--report", tmp_path / "rep")
    assert p.returncode == 0, p.stderr
    assert f"{tmp_path / 'rep' / 'bench.html'} written" in p.stdout
    assert Page((tmp_path / "rep" / "bench.html").read_text()).tags.get("svg") == 2
    bad = run("bench", RELU, "--report", RELU)  # a file: checked before any work
    assert bad.returncode == 2 and "--report" in bad.stderr


def test_write_bench_report_makes_its_folder(tmp_path):
    path = write_bench_report(tmp_path / "a" / "b", bench(ROWS[:1]))
    assert path == tmp_path / "a" / "b" / "bench.html" and path.read_text().startswith("<!DOCTYPE html>")
