"""The command line: budget parsing, exit codes, one-line errors, `--debug`, and optimize's
atomic output folder. The tests call `kernelwright.cli.main()` in this process through the `run`
fixture (tests/conftest.py); tests/e2e/test_cli_runs.py has real optimize runs and the entry point
`python -m kernelwright` in a process of its own."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernelwright import cli, pipeline
from kernelwright.cli import parse_budget
from kernelwright.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests" / "fixtures" / "bad").glob("*.py"))


def _one_line(p, code, *needles):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _one_line_error(p, *needles):
    line = _one_line(p, 2, *needles)
    assert line.startswith("kernelwright: error: "), line
    return line


# -- parse_budget -------------------------------------------------------------------------

def test_parse_budget_trials():
    assert parse_budget(["40"]) == (40, None)


def test_parse_budget_seconds():
    assert parse_budget(["90s"]) == (None, 90.0)
    assert parse_budget(["2m"]) == (None, 120.0)


def test_parse_budget_both():
    assert parse_budget(["40", "90s"]) == (40, 90.0)
    assert parse_budget(["90s", "40"]) == (40, 90.0)


def test_parse_budget_none():
    assert parse_budget(None) == (None, None)
    assert parse_budget([]) == (None, None)


@pytest.mark.parametrize("bad", ["abc", "", "-3", "0", "1.5", "40x", "s"])
def test_parse_budget_invalid(bad):
    with pytest.raises(UserError):
        parse_budget([bad])


# -- commands and their bad input ----------------------------------------------------------

# `inspect` runs Problem.check() before capturing, so a bad problem is one line: a forward returning a
# dict would otherwise print a table, and torch.export's fake-tensor logger a multi-line ERROR log
# (which shows on a real process's stderr: tests/e2e/test_cli_runs.py checks one there).
@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_inspect_bad_problem(run, path):
    assert BAD, "no fixtures"
    _one_line_error(run("inspect", path), path.name)


def test_doctor(run):
    p = run("doctor")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


def test_inspect_json(run):
    p = run("inspect", ROOT / "problems/level1/softmax.py", "--json", "--small")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert isinstance(data["nodes"], list) and data["nodes"]
    for n in data["nodes"]:
        for key in ("op", "class", "flops", "bytes"):
            assert key in n, (key, n)
    assert any("softmax" in n["op"] for n in data["nodes"])


def test_inspect_json_full_size(run):
    p = run("inspect", ROOT / "problems/level1/softmax.py", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["nodes"]


def test_inspect_missing_file(run, tmp_path):
    _one_line_error(run("inspect", tmp_path / "nope.py"), "nope.py", "no such file")


def test_inspect_unknown_device(run):
    _one_line_error(run("inspect", ROOT / "problems/level1/relu.py", "--small", "--device-name", "tpu9"), "tpu9")


def test_optimize_model_that_fails_on_real_data(run, tmp_path):
    """The meta-device check passes (shapes only), eager fails on the device: one line naming the
    policy and device, exit 2, nothing written (on a GPU a model that builds CPU index tensors in
    its forward fails the same way)."""
    path = ROOT / "tests" / "fixtures" / "runtime_bad" / "fails_on_data.py"
    p = run("optimize", path, "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(p, "fails_on_data.py", "the model itself fails under the fp32 policy on cpu", "IndexError")
    assert os.listdir(tmp_path) == []


def test_optimize_missing_file(run, tmp_path):
    _one_line_error(run("optimize", tmp_path / "nope.py", "--out", tmp_path / "o", "--device", "cpu"), "nope.py")


def test_optimize_missing_out(run):
    _one_line_error(run("optimize", RELU, "--device", "cpu"), "--out")


def test_optimize_bad_precision(run, tmp_path):
    _one_line_error(run("optimize", RELU, "--out", tmp_path / "o", "--precision", "fp64", "--device", "cpu"), "fp64")
    assert not (tmp_path / "o").exists()


def test_optimize_bad_budget(run, tmp_path):
    _one_line_error(run("optimize", RELU, "--out", tmp_path / "o", "--budget", "abc", "--device", "cpu"), "abc")


def test_bad_compile_mode(run, tmp_path):
    p = run("optimize", RELU, "--out", tmp_path / "o", "--compile-mode", "fastest", "--device", "cpu")
    _one_line_error(p, "fastest", "reduce-overhead")
    assert not (tmp_path / "o").exists()
    _one_line_error(run("bench", RELU, "--compile-mode", "fastest"), "fastest")


def test_optimize_bad_device(run, tmp_path):
    _one_line_error(run("optimize", RELU, "--out", tmp_path / "o", "--device", "tpu"), "tpu")


def test_bad_hang_limit_is_one_line_and_writes_nothing(run, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_HANG_S", "soon")
    p = run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu", "--small")
    _one_line_error(p, "KERNELWRIGHT_HANG_S", "soon")
    assert os.listdir(tmp_path) == []


def test_bad_compile_workers_is_one_line_and_writes_nothing(run, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", "many")
    p = run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu", "--small")
    _one_line_error(p, "KERNELWRIGHT_COMPILE_WORKERS", "many")
    assert os.listdir(tmp_path) == []


def test_bench_without_gpu(run):
    """Without a GPU bench runs on the CPU, untimed; what needs timing is a one-line error."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    for args in (["--baseline-only"], ["--train"], ["--device", "cuda"], ["--device", "cpu", "--report", "rep"]):
        assert "GPU" in _one_line_error(run("bench", RELU, *args)), args


def test_bench_missing_path_and_empty_out(run, tmp_path):
    _one_line_error(run("bench", tmp_path / "nope"), "nope", "no such file")
    _one_line_error(run("bench", RELU, "--out", ""), "--out", "empty")


def test_report_empty_folder(run, tmp_path):
    _one_line_error(run("report", tmp_path), "result.json")


def test_report_bad_json(run, tmp_path):
    (tmp_path / "result.json").write_text("{not json")
    _one_line_error(run("report", tmp_path), "JSON")


def test_report_missing_folder_or_a_file(run, tmp_path):
    _one_line_error(run("report", tmp_path / "nope"), "nope", "no such folder")
    (tmp_path / "f").write_text("x")
    _one_line_error(run("report", tmp_path / "f"), "not a folder")
    _one_line_error(run("report", ""), "empty")


@pytest.mark.parametrize("text", ["[]", "{}", '{"problem": "relu"}'])
def test_report_json_that_is_not_a_result(run, tmp_path, text):
    (tmp_path / "result.json").write_text(text)
    _one_line_error(run("report", tmp_path), "not an optimize result")


def test_unknown_command(run):
    _one_line_error(run("frobnicate"), "frobnicate")


def test_no_command_prints_the_help_and_one_line(run):
    p = run()
    _one_line_error(p, "missing command")
    assert "optimize" in p.stdout


def test_help_anywhere_exits_0(run):
    assert run("--help").returncode == 0
    p = run("optimize", "--help")
    assert p.returncode == 0 and "--out" in p.stdout


# -- --debug -------------------------------------------------------------------------------

def test_without_debug_takes_every_debug_out_up_to_a_double_dash():
    assert cli._without_debug(["--debug", "report", "d", "--debug"]) == (True, ["report", "d"])
    assert cli._without_debug(["report", "d"]) == (False, ["report", "d"])
    assert cli._without_debug(["report", "--", "--debug"]) == (False, ["report", "--", "--debug"])


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_anywhere_shows_the_traceback(run, tmp_path, monkeypatch, where):
    def broken(problem, out_dir, opts):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(pipeline, "optimize_problem", broken)
    args = ["optimize", RELU, "--out", tmp_path / "o", "--device", "cpu"]
    line = _one_line(run(*args), 1, "internal error", "RuntimeError", "boom", "--debug")
    assert "second line" not in line
    monkeypatch.setattr(sys, "argv", ["kernelwright", *map(str, ["--debug", *args] if where == "before" else [*args, "--debug"])])
    with pytest.raises(RuntimeError, match="boom"):
        cli.main()
    assert os.listdir(tmp_path) == []


def test_debug_after_the_command_raises_bad_input(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["kernelwright", "report", str(tmp_path / "nope"), "--debug"])
    with pytest.raises(UserError, match="no such folder"):
        cli.main()
    monkeypatch.setattr(sys, "argv", ["kernelwright", "report", str(tmp_path / "nope")])
    with pytest.raises(SystemExit) as e:  # the debug state does not outlive its run
        cli.main()
    assert e.value.code == 2


# -- optimize's output folder --------------------------------------------------------------

RELU = ROOT / "problems" / "level1" / "relu.py"
PASSED = {"problem": "relu", "precision": "fp32", "device": "cpu", "verify": {"passed": True}}


def fake_pipeline(monkeypatch, result=PASSED, then=None, seen=None):
    """Replace the pipeline with one that writes an output folder as optimize_problem does (naming
    the folder it writes in result.json, as a failed candidate's message may) and returns `result`,
    or raises `then` once it has written; `seen` collects the folders it was given."""
    def optimize_problem(problem, out_dir, opts):
        out_dir = Path(out_dir)
        (seen if seen is not None else []).append(out_dir)
        (out_dir / ".build" / "any").mkdir(parents=True)
        (out_dir / ".build" / "any" / "k_1.py").write_text("# cache")
        (out_dir / "kernels").mkdir()
        (out_dir / "kernels" / "g0.py").write_text("# kernel")
        (out_dir / "model_new.py").write_text("# new")
        record = {**result, "note": f"candidate failed in {out_dir / '.build' / 'any' / 'k_1.py'}"}
        (out_dir / "result.json").write_text(json.dumps(record, indent=2))
        (out_dir / "report.md").write_text(f"# report\n{record['note']}\n")
        if then is not None:
            raise then
        return record

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)


def not_called(monkeypatch):
    def optimize_problem(problem, out_dir, opts):
        raise AssertionError("the pipeline ran")

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)


def tree(folder: Path) -> dict:
    """Every file under `folder` with its text (hidden ones too)."""
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def no_staging_left(folder: Path):
    left = [p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name]
    assert not left, left


def test_out_empty_is_bad_input_and_writes_nothing(run, tmp_path, monkeypatch):
    not_called(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _one_line_error(run("optimize", RELU, "--out", "", "--device", "cpu"), "--out", "empty")
    _one_line_error(run("optimize", RELU, "--out", "  ", "--device", "cpu"), "--out", "empty")
    assert os.listdir(tmp_path) == []


def test_out_below_a_regular_file_is_bad_input(run, tmp_path, monkeypatch):
    not_called(monkeypatch)
    (tmp_path / "f").write_text("x")
    line = _one_line_error(run("optimize", RELU, "--out", tmp_path / "f" / "a" / "o", "--device", "cpu"),
                           str(tmp_path / "f" / "a" / "o"), "not a folder")
    assert str(tmp_path / "f") in line
    _one_line_error(run("optimize", RELU, "--out", tmp_path / "f", "--device", "cpu"), "exists and is not a folder")
    assert tree(tmp_path) == {"f": "x"}


def test_out_that_is_a_broken_link_is_bad_input(run, tmp_path, monkeypatch):
    not_called(monkeypatch)
    (tmp_path / "o").symlink_to(tmp_path / "gone")
    _one_line_error(run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu"), "not a folder")


def test_out_in_a_folder_that_cannot_be_written_is_bad_input(run, tmp_path, monkeypatch):
    """Checked with os.access (as root, a read-only folder is writable: see the test below)."""
    not_called(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != ro and real(path, mode, **kw))
    _one_line_error(run("optimize", RELU, "--out", ro / "a" / "o", "--device", "cpu"),
                    str(ro / "a" / "o"), f"cannot write in {ro}")
    _one_line_error(run("optimize", RELU, "--out", ro, "--device", "cpu"), f"cannot write in {ro}")
    assert os.listdir(ro) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs POSIX permissions, not as root")
def test_out_under_a_read_only_folder_is_bad_input(run, tmp_path, monkeypatch):
    not_called(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _one_line_error(run("optimize", RELU, "--out", ro / "o", "--device", "cpu"), str(ro / "o"), "cannot write")
    finally:
        ro.chmod(0o755)


def test_output_is_staged_beside_out_and_moved_in(run, tmp_path, monkeypatch):
    seen = []
    fake_pipeline(monkeypatch, seen=seen)
    out = tmp_path / "a" / "b" / "o"  # parents made only once the run has finished
    p = run("optimize", RELU, "--out", out, "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert f"{out}/model_new.py written" in p.stdout
    assert seen[0].parent == tmp_path and seen[0].name.startswith(".o.partial-")
    files = tree(out)
    assert set(files) == {".build/any/k_1.py", "kernels/g0.py", "model_new.py", "result.json", "report.md",
                          "report.html"}
    assert ".partial-" not in files["report.html"]
    for record in ("result.json", "report.md"):  # the folder the user named, never the staging one
        assert ".partial-" not in files[record]
        assert str(out / ".build" / "any" / "k_1.py") in files[record]
    assert os.listdir(tmp_path) == ["a"]


def test_existing_out_keeps_other_files_and_gets_the_new_ones(run, tmp_path, monkeypatch):
    fake_pipeline(monkeypatch)
    out = tmp_path / "o"
    (out / "kernels").mkdir(parents=True)
    (out / "kernels" / "old.py").write_text("# old kernel")
    (out / "model_new.py").write_text("# old")
    (out / "notes.txt").write_text("mine")
    p = run("optimize", RELU, "--out", out, "--device", "cpu")
    assert p.returncode == 0, p.stderr
    files = tree(out)
    assert files["notes.txt"] == "mine"
    assert files["model_new.py"] == "# new"
    assert "kernels/old.py" not in files and files["kernels/g0.py"] == "# kernel"
    assert ".partial-" not in files["result.json"] + files["report.md"]
    no_staging_left(tmp_path)


def test_out_dot_is_the_current_folder(run, tmp_path, monkeypatch):
    fake_pipeline(monkeypatch)
    (tmp_path / "o").mkdir()
    monkeypatch.chdir(tmp_path / "o")
    assert run("optimize", RELU, "--out", ".", "--device", "cpu").returncode == 0
    assert (tmp_path / "o" / "model_new.py").read_text() == "# new"
    no_staging_left(tmp_path)


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_run_leaves_out_as_it_was(run, tmp_path, monkeypatch, existing):
    fake_pipeline(monkeypatch, then=RuntimeError("disk on fire"))
    out = tmp_path / "o"
    if existing:
        out.mkdir()
        (out / "model_new.py").write_text("# old")
    before = tree(tmp_path)
    _one_line(run("optimize", RELU, "--out", out, "--device", "cpu"), 1, "internal error", "disk on fire")
    assert tree(tmp_path) == before
    assert out.exists() == existing
    no_staging_left(tmp_path)


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_exits_130_and_leaves_nothing_half_written(run, tmp_path, monkeypatch, existing):
    fake_pipeline(monkeypatch, then=KeyboardInterrupt())
    out = tmp_path / "o"
    if existing:
        out.mkdir()
        (out / "report.md").write_text("# the last run")
    before = tree(tmp_path)
    p = run("optimize", RELU, "--out", out, "--device", "cpu")
    assert _one_line(p, 130) == "kernelwright: interrupted"
    assert tree(tmp_path) == before
    assert out.exists() == existing
    no_staging_left(tmp_path)


def test_ctrl_c_outside_a_command_exits_130(run, monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr("kernelwright.doctor.collect", interrupted)
    assert _one_line(run("doctor"), 130) == "kernelwright: interrupted"


def test_a_move_that_fails_half_way_puts_everything_back(tmp_path, monkeypatch):
    staging, out = tmp_path / ".o.partial-1-x", tmp_path / "o"
    for folder, text in ((staging, "new"), (out, "old")):
        folder.mkdir()
        (folder / "a.txt").write_text(text)
    (staging / "b.txt").write_text("new")
    (out / "keep.txt").write_text("mine")
    real = os.rename

    def rename(src, dst):
        if Path(src) == staging / "b.txt":
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        cli._commit(staging, out)
    assert tree(out) == {"a.txt": "old", "keep.txt": "mine"}
    assert tree(staging) == {"a.txt": "new", "b.txt": "new"}
    assert sorted(os.listdir(tmp_path)) == [".o.partial-1-x", "o"]


def test_staging_left_by_a_dead_process_is_removed(run, tmp_path, monkeypatch):
    """A hang exit (os._exit) or a kill leaves its staging folder; the next run into the same
    --out removes it, and leaves a running process's one alone."""
    fake_pipeline(monkeypatch)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".o.partial-{int(dead.stdout)}-abc"
    live = tmp_path / f".o.partial-{os.getpid()}-abc"
    other = tmp_path / f".other.partial-{int(dead.stdout)}-abc"
    for folder in (stale, live, other):
        (folder / "kernels").mkdir(parents=True)
    assert run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu").returncode == 0
    assert not stale.exists() and live.exists() and other.exists()


# -- verification verdicts -----------------------------------------------------------------

def test_verification_failure_exits_1_in_one_line_and_keeps_the_output(run, tmp_path, monkeypatch):
    fake_pipeline(monkeypatch, result={**PASSED, "verify": {"passed": False}})
    out = tmp_path / "o"
    p = run("optimize", RELU, "--out", out, "--device", "cpu")
    _one_line(p, 1, "FAILED verification", f"{out}/report.md")
    assert {"model_new.py", "report.md", "result.json"} <= set(os.listdir(out))
    no_staging_left(tmp_path)


def test_generated_program_failed_and_original_forward_kept_exits_0(run, tmp_path, monkeypatch):
    fake_pipeline(monkeypatch, result={**PASSED, "verify_fallback": {"passed": False, "reason": "excess"}})
    p = run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu")
    _one_line(p, 0, "generated program FAILED verification", "original forward was kept")


def test_both_failed_is_one_line_exit_1(run, tmp_path, monkeypatch):
    fake_pipeline(monkeypatch, result={**PASSED, "verify": {"passed": False}, "verify_fallback": {"passed": False}})
    line = _one_line(run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu"), 1, "emitted module FAILED")
    assert "original forward was kept" not in line


# -- --no-library ---------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["no_library", "retune"])
@pytest.mark.parametrize("given", [False, True])
def test_optimize_flags_set_their_options(run, tmp_path, monkeypatch, option, given):
    """--no-library / --retune reach Options.no_library / Options.retune; without them, False."""
    fake_pipeline(monkeypatch)
    fake, seen = pipeline.optimize_problem, []

    def optimize_problem(problem, out_dir, opts):
        seen.append(opts)
        return fake(problem, out_dir, opts)

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)
    flag = ["--" + option.replace("_", "-")] if given else []
    p = run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu", *flag)
    assert p.returncode == 0, p.stderr
    assert [getattr(o, option) for o in seen] == [given]


def test_optimize_json_and_quiet(run, tmp_path, monkeypatch):
    """--json: one JSON line on stdout (verification, times, speedups, the folder); --quiet: the
    pipeline's progress lines are dropped."""
    timed = {**PASSED, "timing": {"eager": {"median_ms": 2.0}, "compile": {"median_ms": 1.0},
                                  "kernelwright": {"median_ms": 0.5}}}
    fake_pipeline(monkeypatch, result=timed)
    fake, logged = pipeline.optimize_problem, []

    def optimize_problem(problem, out_dir, opts):
        logged.append(opts.log("progress line"))
        return fake(problem, out_dir, opts)

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)
    p = run("optimize", RELU, "--out", tmp_path / "o", "--device", "cpu", "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["verified"] is True and summary["out"] == str(tmp_path / "o")
    assert summary["speedup_vs_compile"] == 2.0 and summary["speedup_vs_eager"] == 4.0
    assert "progress line" not in p.stderr
    p = run("optimize", RELU, "--out", tmp_path / "o2", "--device", "cpu")
    assert p.returncode == 0 and "progress line" in p.stderr and "model_new.py written" in p.stdout


@pytest.mark.parametrize("flag", [[], ["--no-library"]])
def test_bench_no_library_reaches_each_problems_options(run, tmp_path, monkeypatch, flag):
    """bench --no-library: run_bench gets it, and each problem's optimize runs with Options.no_library."""
    from kernelwright.bench import runner

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    monkeypatch.setattr(runner, "run_bench", lambda *a, **kw: calls.append(kw))
    p = run("bench", RELU, *flag)
    assert p.returncode == 0, p.stderr
    assert [kw["no_library"] for kw in calls] == [bool(flag)]

    seen = []

    def optimize_problem(problem, out_dir, opts):
        seen.append(opts)
        opts.log("g0 [pointwise] relu: triton")
        return dict(PASSED)

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)
    opts = dict(baseline_only=False, precision="fp32", trials=1, seconds=None, out_dir="runs", small=True,
                compile_mode="default", no_library=calls[0]["no_library"])
    row = runner._one(str(RELU), opts)
    assert "error" not in row, row
    # the optimize's log, each line with its seconds, beside the problem's folder (kept where a
    # time limit cuts the problem before its folder is written)
    progress = (tmp_path / "runs" / f"level{row['level']}" / f"{row['problem']}.progress.log").read_text()
    assert re.fullmatch(r"\[ *\d+\.\d s\] g0 \[pointwise\] relu: triton\n", progress), progress
    assert 0 <= row["wall_s"] < 60  # the problem's whole time, recorded per row
    assert [o.no_library for o in seen] == [bool(flag)]
    assert [o.retune for o in seen] == [True]  # a benchmark times the whole search, never a stored choice


def test_progress_on_a_terminal_draws_a_status_line(monkeypatch, capsys):
    """On a terminal each progress line is printed and a live status line counts them; off one,
    plain lines; with --quiet nothing."""
    log, trial, ctx = cli._progress(True)
    assert trial is None
    with ctx:
        log("unit g0 done")
    assert "unit g0 done" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    log, trial, ctx = cli._progress(False)
    with ctx:
        log("g0 [pointwise] relu: triton 0.010 ms")
    assert "g0 [pointwise] relu: triton 0.010 ms" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [[], ["--baseline-only"]])
def test_bench_train_times_training_steps_of_each_implementation(run, monkeypatch, tmp_path, flag):
    """bench --train: run_train_bench gets eager, torch.compile and (unless --baseline-only) the
    kernelwright backend (each partition), the step count and a timed share of it; --steps below 2
    is one line."""
    from kernelwright.bench import training

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    monkeypatch.setattr(training, "run_train_bench", lambda files, policy, impls, steps, timed, *a, **kw:
                        calls.append((policy.name, sorted(impls), steps, timed)))
    p = run("bench", RELU, "--train", "--steps", "12", "--precision", "tf32", *flag)
    assert p.returncode == 0, p.stderr
    want = ["compile", "eager"] + ([] if flag else ["kernelwright", "kernelwright-save"])
    assert calls == [("tf32", want, 12, 4)]
    p = run("bench", RELU, "--train", "--steps", "1")
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "at least 2 steps" in p.stderr


def test_bench_rewrites_ab_optimizes_again_only_where_a_rule_applied(run, tmp_path, monkeypatch):
    """bench --rewrites-ab: a problem an exact-algebra rule changed is optimized a second time with
    no_rewrites (into a folder of its own) and timed both ways; a problem no rule changed keeps its
    one time for both (the same program); the level's summary carries both geomeans."""
    from kernelwright.bench import runner
    from kernelwright.plan.algebra import note

    calls = []

    def optimize_problem(problem, out_dir, opts):
        calls.append((problem.name, opts.no_rewrites, Path(out_dir).name))
        ruled = problem.name == "relu" and not opts.no_rewrites
        kw = 1.0 if ruled else 2.0
        return dict(PASSED, rewrites=[note("sum_1", "sum moved", "reduction_through_affine", 64)] if ruled else [],
                    timing={"compile": {"median_ms": 2.0}, "kernelwright": {"median_ms": kw}})

    monkeypatch.setattr(pipeline, "optimize_problem", optimize_problem)
    opts = dict(baseline_only=False, precision="fp32", trials=1, seconds=None, out_dir=str(tmp_path), small=True,
                compile_mode="default", rewrites_ab=True)
    rows = [runner._one(str(RELU), opts), runner._one(str(ROOT / "problems" / "level1" / "tanh.py"), opts)]
    assert calls == [("relu", False, "relu"), ("relu", True, "no_rewrites"), ("tanh", False, "tanh")]
    assert rows[0]["rules"] == ["reduction_through_affine"] and rows[0]["times"]["kernelwright:no_rewrites"] == 2.0
    assert rows[1]["rules"] == [] and rows[1]["times"]["kernelwright:no_rewrites"] == 2.0
    assert runner.summarise(rows, False)["level1"]["kw_over_compile_rewrites_ab"] == [2, pytest.approx(2 ** 0.5), 1.0]
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    p = run("bench", RELU, "--rewrites-ab", "--no-rewrites")
    assert p.returncode != 0 and "leave out --no-rewrites" in p.stderr and p.stderr.strip().count("\n") == 0
