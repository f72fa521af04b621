"""report.html from result.json: the page of a recorded GPU run (tests/fixtures/report_gpu) and of
results without times, read back with html.parser; in headless Chromium where one is installed."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from html_page import Page, embedded_only  # tests/html_page.py (tests/ is on the path through conftest.py)

from kernelwright.analyze.device import H200
from kernelwright.emit.report_html import load_trials, render_html, unit_flops, write_html_report

GPU_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "report_gpu"


def gpu_run(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(GPU_RUN, folder)
    return folder


def test_the_recorded_gpu_run_gives_a_page_with_its_charts(tmp_path):
    folder = gpu_run(tmp_path)
    result = json.loads((folder / "result.json").read_text())
    path = write_html_report(folder, result, folder / "trials.jsonl")
    raw = path.read_text()
    page = Page(raw)
    embedded_only(page, raw)
    # the whole model's times, the roofline, the unit's times and its search curve
    assert page.tags.get("svg") == 4, page.tags
    assert "Nothing was timed" not in page.text
    for text in ("kernelwright report: gemm_group_norm_swish", "GPU NVIDIA H200", "precision policy fp32",
                 "eager 6.009 ms, compile 5.758 ms, kernelwright 5.652 ms", "1.06x over eager", "1.02x over compile",
                 "PASS", "8 trials (0 failed)", "generated kernels 74% of bytes", "Roofline", "Time per unit",
                 "g0 (3941 GB/s, 94% of the memory ceiling)", "kernels/g0.py", "def g0_kernel"):
        assert text in page.text, text
    # the unit's row: strategy, template, config, time, bandwidth against the ceiling, resources
    assert "g0 normalization native_group_norm getitem sigmoid mul triton triton.row BLOCK_M=4" in page.text
    assert "0.068 0.442 3941 94%" in page.text and "27 0 0 8 (0 failed)" in page.text
    assert "class=\"hl\"" in raw  # pygments' highlighted source
    assert "roofline against NVIDIA H200" in raw and "fp32 51 TFLOP/s" in raw  # the ceilings drawn, from DeviceSpec


def test_the_search_curve_reads_the_units_last_trials_of_this_problem():
    result = json.loads((GPU_RUN / "result.json").read_text())
    trials = load_trials(GPU_RUN / "trials.jsonl", result)
    assert set(trials.per_unit) == {"g0"} and trials.gpu == "NVIDIA H200"
    recs = trials.per_unit["g0"]
    assert len(recs) == 8  # the database also holds a gemm_softmax run's g0
    assert all(r["task_key"].startswith("gemm_group_norm_swish/g0/") for r in recs)
    assert [r["timestamp"] for r in recs] == sorted(r["timestamp"] for r in recs)
    assert min(r["time_ms"] for r in recs) == pytest.approx(result["groups"][0]["time_ms"])


def test_without_a_trial_database_the_page_says_why_there_is_no_curve(tmp_path):
    result = json.loads((GPU_RUN / "result.json").read_text())
    page = Page(render_html(result, GPU_RUN, load_trials(tmp_path / "none.jsonl", result)))
    assert page.tags.get("svg") == 3
    assert "No search curve for g0" in page.text and "none.jsonl" in page.text


def test_the_roofline_places_units_with_a_flop_count():
    """A GEMM pair records its rate in its note; a unit row may carry its FLOPs."""
    assert unit_flops({"note": "61.2 TFLOP/s", "time_ms": 2.0}) == pytest.approx(61.2e12 * 2e-3)
    assert unit_flops({"flops": 1e9, "note": ""}) == 1e9
    assert unit_flops({"note": "", "time_ms": 1.0}) is None
    result = json.loads((GPU_RUN / "result.json").read_text())
    pair = dict(result["groups"][0], id="g0+addmm_mm", kind="gemm_rowreduce", note="45.0 TFLOP/s", time_ms=5.5,
                bytes=268468224 * 2, choices=[])
    result["modes"]["any"]["groups"].append(pair)  # what the page reads: each mode's record
    raw = render_html(result, None, spec=H200)
    assert ">g0+addmm_mm<" in raw  # named beside its point on the roofline
    assert "45.00 88%" in Page(raw).text  # TFLOP/s and % of the fp32 ceiling in the unit table


def untimed_result() -> dict:
    """A CPU run's result.json, as the pipeline writes it (gemm_softmax at its SMALL sizes)."""
    group = {"id": "g0", "kind": "normalization", "ops": ["add", "_softmax"], "strategy": "triton",
             "config": {"BLOCK_M": 8, "BLOCK_R": 16}, "time_ms": None, "library_ms": None, "excess": -1e-6,
             "eager_excess": -1e-6, "bytes": 1088, "gbps": None, "trials": 1, "failed": 0,
             "note": "untimed: heuristic/cost-model choice", "resources": {},
             "choices": [{"choice": "library", "time_ms": None, "trials": 0, "failed": 0},
                         {"choice": "triton.row", "time_ms": None, "trials": 1, "failed": 0}]}
    verify = {"passed": True, "excess": -1e-6, "eager_excess": -1e-6, "threshold": 1e-4, "reason": None}
    mode = {"capture": "ok", "groups": [group], "captured_cost": {"flops": 8960, "bytes": 4672}, "rewrites": [],
            "verify": verify, "timing": None}
    return {"problem": "gemm_softmax", "path": "problems/level2/gemm_softmax.py", "precision": "fp32",
            "device": "cpu", "small": True, **mode, "mode": "any", "mode_modules": [], "modes": {"any": mode},
            "untuned_modes": [], "analysis": {"coverage": {"generated_flops": 0.09, "generated_bytes": 0.37,
                                                           "library_flops": 0.91, "library_bytes": 0.63}},
            "seconds": 5.75, "memory": None}


def test_an_untimed_result_says_nothing_was_timed_and_draws_no_chart():
    raw = render_html(untimed_result())
    page = Page(raw)
    embedded_only(page, raw)
    assert "svg" not in page.tags and "img" not in page.tags
    assert "Nothing was timed (no CUDA GPU" in page.text
    assert "times not timed" in page.text and "PASS" in page.text
    assert "g0 normalization add _softmax triton - BLOCK_M=8, BLOCK_R=16 - -" in page.text


def test_each_training_mode_gets_its_section():
    result = untimed_result()
    train = dict(result["modes"]["any"], verify=dict(result["verify"], passed=False, reason="excess 3.0"))
    result["modes"] = {"train": train, "eval": result["modes"]["any"]}
    page = Page(render_html(result))
    assert "train mode" in page.text and "eval mode" in page.text
    assert "verification (train) FAIL" in page.text and "excess 3.0" in page.text


def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium on this machine (Debian: apt-get install chromium)")
def test_the_page_loads_in_headless_chromium_with_every_chart_drawn(tmp_path):
    """The page in a real browser, nothing reachable outside it: a probe appended to a copy of the
    page counts the charts drawn with a size and the images loaded, and the DOM comes back."""
    folder = gpu_run(tmp_path)
    result = json.loads((folder / "result.json").read_text())
    page = write_html_report(folder, result, folder / "trials.jsonl")
    probe = ("<script>window.addEventListener('load', () => { const svgs = [...document.querySelectorAll('svg')];"
             "document.body.dataset.drawn = svgs.filter(s => s.getBoundingClientRect().width > 0).length;"
             "document.body.dataset.images = [...document.images].filter(i => !i.complete || !i.naturalWidth).length;"
             "});</script>")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", probe + "</body>"))
    p = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                        "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'data-drawn="4"' in p.stdout and 'data-images="0"' in p.stdout, p.stdout[:500]
    assert "gemm_group_norm_swish" in p.stdout


def test_the_report_command_writes_the_page_beside_report_md(run, tmp_path):
    folder = gpu_run(tmp_path)
    p = run("report", folder, "--db", folder / "trials.jsonl")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (folder / "report.md").read_text().strip()  # report.md printed, as before
    assert p.stderr.strip() == f"{folder / 'report.html'} written"
    assert Page((folder / "report.html").read_text()).tags.get("svg") == 4


@pytest.mark.parametrize("content", [None, "{ not json", "[1, 2]"])
def test_the_report_command_turns_bad_input_into_one_line(run, tmp_path, content):
    if content is not None:
        (tmp_path / "result.json").write_text(content)
    p = run("report", tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("kernelwright: error: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "report.html").exists()
