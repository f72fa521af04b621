"""Smoke tests of the maintained tools in scripts/, each runnable on a CPU-only machine in seconds.

The tools that need a GPU are checked through their argument parsing (`--help` imports torch and
kernelwright and exits before any device work); the others run on tiny inputs. The shell scripts
are syntax-checked, and the ones that call `python3 -m kernelwright` run against a stand-in
`python3` on PATH that prints its arguments, so their command lines and output handling are
checked without running a benchmark.
"""
import ast
import json
import os
import runpy
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
CPU_TOOLS = ["bench_table.py", "collect_reports.py", "cost_model_curve.py", "loss_curves.py", "results_csv.py",
             "rnn_registers.py", "shrink_problems.py"]
GPU_TOOLS = ["attention_check.py", "conv_check.py", "kernel_profile.py", "launch_overhead.py", "rnn_check.py", "train_bench.py"]
SHELL_TOOLS = ["cpu_sweep.sh", "device_session.sh", "gpu_bench.sh", "kernelbench.sh"]


def run(cmd, env=None, **kw):
    """Runs cmd in the repository root with src/ importable; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120, **kw)


def py(script, *args, **kw):
    return run([sys.executable, str(SCRIPTS / script), *map(str, args)], **kw)


def test_every_script_has_a_smoke_test():
    """A tool added to scripts/ gets a test here; a one-off probe belongs in git history instead."""
    found = sorted(p.name for p in SCRIPTS.iterdir() if p.name != "__pycache__")
    assert found == sorted(CPU_TOOLS + GPU_TOOLS + SHELL_TOOLS)


@pytest.mark.parametrize("name", CPU_TOOLS + GPU_TOOLS + SHELL_TOOLS)
def test_header_says_how_to_run(name):
    text = (SCRIPTS / name).read_text()
    head = ast.get_docstring(ast.parse(text)) if name.endswith(".py") else text.split("\nset -u", 1)[0]
    assert head and "usage:" in head and f"scripts/{name}" in head


@pytest.mark.parametrize("name", CPU_TOOLS + GPU_TOOLS)
def test_help(name):
    r = py(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {name}") and f"scripts/{name}" in r.stdout


# bench_table.py / collect_reports.py: a bench JSON as `kernelwright bench --json` writes it
ROWS = [
    {"problem": "fast_one", "level": 1, "correct": True, "times": {"eager": 2.0, "compile": 1.0, "kernelwright": 0.5},
     "groups": [["g0", "pointwise", "triton"]]},
    {"problem": "slow_one", "level": 2, "correct": True, "times": {"eager": 2.0, "compile": 1.0, "kernelwright": 2.0},
     "groups": []},
    {"problem": "broken", "level": 2, "correct": False, "error": "capture failed"},
]
SUMMARY = {"level1": {"n": 1, "correct": 1.0, "kw_over_compile": 2.0, "kw_over_eager": 4.0,
                      "compile_over_eager": 2.0, "fast_1_compile": 1.0, "fast_2_compile": 1.0,
                      "kw_over_compile_by_anchor": {"none": [1, 2.0]}},
           "level2": {"n": 2, "correct": 0.5, "kw_over_compile": 0.5}}


def bench_json(tmp_path, **options):
    data = {"rows": ROWS, "summary": SUMMARY, "gpu": "Test GPU", "torch": "2.x",
            "options": {"precision": "tf32", "trials": 4, "compile_mode": None, "baseline_only": False, **options}}
    path = tmp_path / f"bench_{len(options)}.json"
    path.write_text(json.dumps(data))
    return path


def test_bench_table(tmp_path):
    r = py("bench_table.py", bench_json(tmp_path), bench_json(tmp_path, baseline_only=True))
    assert r.returncode == 0, r.stderr
    optimized, baselines = r.stdout.split("\n\n### ")
    assert optimized.startswith("### tf32 — Test GPU, torch 2.x, budget 4 trials/problem")
    assert "| L1 fast_one | 2.000 | 1.000 | 0.500 | yes | 2.00 | g0 |" in optimized
    assert "| L2 broken | - | - | - | NO | - | - |" in optimized
    assert "level1 none (1): 2.000" in optimized
    assert baselines.startswith("baselines only, tf32") and "| L1 fast_one | 2.000 | 1.000 | 2.00 |" in baselines


def test_collect_reports(tmp_path):
    runs = tmp_path / "runs"
    for level, name in ((1, "fast_one"), (2, "slow_one")):
        (runs / f"level{level}" / name).mkdir(parents=True)
        (runs / f"level{level}" / name / "report.md").write_text(f"# report of {name}\n")
    out = tmp_path / "slow.md"
    r = py("collect_reports.py", bench_json(tmp_path), runs, out, "--below", "0.95")
    assert r.returncode == 0, r.stderr
    assert "2 report(s)" in r.stdout
    text = out.read_text()
    assert "<!-- slow_one: vs compile 0.500 -->\n# report of slow_one" in text
    assert "<!-- broken: capture failed -->\n(no report.md)" in text
    assert "fast_one" not in text


def test_collect_reports_unreadable_bench(tmp_path):
    r = py("collect_reports.py", tmp_path / "missing.json", tmp_path, tmp_path / "out.md")
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_loss_curves_draws_a_panel_per_problem_and_refuses_rows_without_curves(tmp_path):
    train = {"eager": {"losses": [1.0, 0.9, 0.8]}, "kernelwright": {"losses": [1.0, 0.9001, 0.8002]}}
    bench = tmp_path / "train.json"
    bench.write_text(json.dumps({"rows": [{"problem": "a", "train": train}, {"problem": "b", "train": train}],
                                 "options": {"precision": "bf16"}}))
    r = py("loss_curves.py", tmp_path / "curves.png", bench)
    assert r.returncode == 0, r.stderr
    assert "2 panels" in r.stdout and (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    r = py("loss_curves.py", tmp_path / "none.png", bench_json(tmp_path))
    assert r.returncode == 1 and "no loss curves" in r.stderr and not (tmp_path / "none.png").exists()


KB_CONV = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape, num_groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.norm = nn.GroupNorm(num_groups, out_channels)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.max_pool3d(self.norm(self.conv(x)) + self.bias, 2)

batch_size = 128
in_channels = 3
out_channels = 64  # a comment
depth = 16; height = width = 64
kernel_size = 3
num_groups = 8
bias_shape = (out_channels, 1, 1, 1)

def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape, num_groups]
"""


def test_shrink_problems_rewrites_sizes_where_assigned_and_leaves_out_what_cannot_run(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conv.py").write_text(KB_CONV)
    (src / "broken.py").write_text(KB_CONV.replace("return torch.max_pool3d", "raise ValueError('no'); return"))
    r = py("shrink_problems.py", tmp_path / "out", src, "--pixels", "2,8")
    assert r.returncode == 0, r.stderr
    assert "broken.py: left out (ValueError: no)" in r.stdout and "wrote 1 of 2 problems" in r.stdout
    text = (tmp_path / "out" / "conv.py").read_text()
    # 2 pixels are fewer than the 3x3x3 kernel: the next size runs
    for line in ("batch_size = 2", "in_channels = 3", "out_channels = 16", "depth = 8; height = width = 8",
                 "kernel_size = 3", "num_groups = 4", "bias_shape = (out_channels, 1, 1, 1)"):
        assert line in text.splitlines(), (line, text)
    assert not (tmp_path / "out" / "broken.py").exists()
    # an image batch's shape written out with literal sizes
    (src / "broken.py").unlink()
    (src / "conv.py").write_text(KB_CONV.replace("torch.rand(batch_size, in_channels, depth, height, width)",
                                                 "torch.rand(batch_size, in_channels, 24, 24, 24)"))
    r = py("shrink_problems.py", tmp_path / "out", src, "--pixels", "2,8")
    assert r.returncode == 0 and "torch.rand(batch_size, in_channels, 8, 8, 8)" in (tmp_path / "out" / "conv.py").read_text()
    r = py("shrink_problems.py", tmp_path / "out", tmp_path / "missing")
    assert r.returncode == 2 and "no such file or folder" in r.stderr
    # lists and tuples of sizes (an MLP's layer widths), element by element under the name's rule
    shrink = runpy.run_path(str(SCRIPTS / "shrink_problems.py"))["shrink"]
    text = shrink("hidden_layer_sizes = [32768, 32768]\nlayer_sizes = (400, 8,)\nkernel_size = (3, 5)\n"
                  "stride = [2]\nsizes = [batch_size, 400]\n", 8).splitlines()
    assert text == ["hidden_layer_sizes = [16, 16]", "layer_sizes = (16, 8)", "kernel_size = (3, 5)", "stride = [2]",
                    "sizes = [batch_size, 400]"]
    assert shrink("feature_sizes = (400,)\n", 8).strip() == "feature_sizes = (16,)"


def test_results_csv_appends_one_row_per_implementation(tmp_path):
    csv_path = tmp_path / "results.csv"
    csv_path.write_text("commit,date,gpu,policy,suite,problem,implementation,median_ms,verified\n")
    r = py("results_csv.py", bench_json(tmp_path), "--commit", "abc1234", "--suite", "s1", "--date", "2026-01-02",
           "--csv", csv_path)
    assert r.returncode == 0, r.stderr
    lines = csv_path.read_text().splitlines()[1:]
    assert "abc1234,2026-01-02,Test GPU,tf32,s1,kernelbench/level1/fast_one,eager,2.0000," in lines
    assert "abc1234,2026-01-02,Test GPU,tf32,s1,kernelbench/level1/fast_one,torch.compile,1.0000," in lines
    assert "abc1234,2026-01-02,Test GPU,tf32,s1,kernelbench/level1/fast_one,kernelwright,0.5000,true" in lines
    assert "abc1234,2026-01-02,Test GPU,tf32,s1,kernelbench/level2/broken,kernelwright,,false" in lines
    assert len(lines) == 7  # fast_one and slow_one: 3 each; broken: its failed kernelwright row


def test_results_csv_takes_a_training_runs_implementations_and_names_its_steps(tmp_path):
    """scripts/train_bench.py's JSON: its implementation keys (compile-ro, compile-ma,
    kernelwright-plain) map to the column's names and each problem is named NAME:train_step."""
    csv_path = tmp_path / "results.csv"
    data = {"train": True, "gpu": "Test GPU", "options": {"precision": "bf16", "steps": 40, "timed": 13},
            "rows": [{"problem": "resnet_basic_block", "level": 3, "path": "problems/level3/resnet_basic_block.py",
                      "correct": True, "times": {"eager": 3.0, "compile": 2.5, "compile-ro": 2.0, "compile-ma": 2.2,
                                                 "kernelwright": 2.1, "kernelwright-plain": 3.2}}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    r = py("results_csv.py", path, "--commit", "abc1234", "--suite", "train_steps", "--date", "2026-01-02",
           "--csv", csv_path)
    assert r.returncode == 0, r.stderr
    rows = {line.split(",")[6]: line for line in csv_path.read_text().splitlines()}
    assert set(rows) == {"eager", "torch.compile", "torch.compile:reduce-overhead", "torch.compile:max-autotune",
                         "kernelwright", "kernelwright:plain"}
    assert rows["kernelwright:plain"] == ("abc1234,2026-01-02,Test GPU,bf16,train_steps,"
                                          "level3/resnet_basic_block:train_step,kernelwright:plain,3.2000,true")


def test_results_csv_unreadable_bench(tmp_path):
    r = py("results_csv.py", tmp_path / "missing.json", "--commit", "c", "--suite", "s", "--csv", tmp_path / "x.csv")
    assert r.returncode == 1 and "cannot read" in r.stderr and not (tmp_path / "x.csv").exists()


def test_cost_model_curve_errors(tmp_path):
    r = py("cost_model_curve.py", "--sizes", "0,a")
    assert r.returncode == 2 and "--sizes must be integers" in r.stderr
    empty = tmp_path / "trials.jsonl"
    empty.write_text("")
    r = py("cost_model_curve.py", empty)
    assert r.returncode == 1 and r.stderr.startswith("error: no task to hold out")
    r = py("cost_model_curve.py", "--replay", empty)
    assert r.returncode == 1 and r.stderr.startswith("error: no unit has 20 measured configs")
    r = py("cost_model_curve.py", "--replay", "--strategies", "random,greedy")
    assert r.returncode == 2 and "--strategies takes" in r.stderr


def test_cost_model_curve_replay(tmp_path):
    """--replay on a small database: one unit of 8 configs measured, every strategy replayed."""
    rows = [{"task_key": f"p{i % 2}/g0", "precision": "tf32", "template": "triton.row", "error": None,
             "config": {"template": "triton.row", "params": {"BLOCK_M": 2 ** j}}, "time_ms": 1.0 + abs(j - 3),
             "task_features": {"kind": "reduction"}, "timestamp": float(j)} for i in range(2) for j in range(8)]
    db = tmp_path / "trials.jsonl"
    db.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = py("cost_model_curve.py", "--replay", db, "--min-configs", "8", "--seeds", "0,1")
    assert r.returncode == 0, r.stderr
    assert "2 units of 8-8 measured configs" in r.stdout
    for name in ("random", "model-cold", "model-warm", "shipped", "recorded"):
        assert f"| {name} |" in r.stdout
    assert "| recorded | 4 (4) |" in r.stdout  # the recorded order reaches BLOCK_M=8 (j = 3) at its 4th trial
    # warm models that also learn from the packaged trials: the same two units replayed
    r = py("cost_model_curve.py", "--replay", db, "--min-configs", "8", "--seeds", "0", "--strategies",
           "model-warm", "--with-priors")
    assert r.returncode == 0, r.stderr
    assert "2 units of 8-8 measured configs" in r.stdout and "| model-warm |" in r.stdout


@pytest.mark.parametrize("name", SHELL_TOOLS)
def test_shell_syntax_and_help(name):
    assert run(["bash", "-n", str(SCRIPTS / name)]).returncode == 0
    r = run(["bash", str(SCRIPTS / name), "--help"])
    assert r.returncode == 0 and f"usage: scripts/{name}" in r.stdout


@pytest.mark.parametrize("name", ["device_session.sh", "gpu_bench.sh", "kernelbench.sh"])
def test_shell_missing_arguments(name):
    r = run(["bash", str(SCRIPTS / name), "only_one"])
    assert r.returncode == 2 and f"usage: scripts/{name}" in r.stderr


@pytest.fixture
def fake_python(tmp_path):
    """A `python3` first on PATH that prints its arguments and $FAKE_TEXT, and exits $FAKE_RC."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text('#!/usr/bin/env bash\necho "args: $*"\nprintf "%b" "${FAKE_TEXT:-}"\nexit "${FAKE_RC:-0}"\n')
    stub.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_gpu_bench_command_line(tmp_path, fake_python):
    out = tmp_path / "out"
    r = run(["bash", str(SCRIPTS / "gpu_bench.sh"), "run1", "3", "a.py", "b.py"],
            env={**fake_python, "OUT": str(out), "PRECISION": "bf16", "KW_RUNS": str(tmp_path / "runs")})
    assert r.returncode == 0, r.stderr
    expected = (f"args: -m kernelwright bench a.py b.py --precision bf16 --budget 3 --json {out}/run1.json "
                f"--out {tmp_path}/runs")
    assert expected in r.stdout and expected in (out / "run1.log").read_text()


def test_kernelbench_runs_each_number_and_says_what_is_missing(tmp_path, fake_python):
    kb = tmp_path / "level2"
    kb.mkdir()
    (kb / "7_Conv2d_ReLU.py").write_text("")
    out = tmp_path / "out"
    r = run(["bash", str(SCRIPTS / "kernelbench.sh"), "l2", str(kb), "7", "8"],
            env={**fake_python, "OUT": str(out), "WORK": str(tmp_path / "work"), "BUDGET": "3", "EXTRA": "--mode eval"})
    log = (out / "l2.log").read_text()
    assert f"args: -m kernelwright bench {kb}/7_Conv2d_ReLU.py --precision tf32 --budget 3 --json" in log
    assert "--mode eval" in log and "== 8: no file 8_*.py" in log
    assert r.returncode == 1 and "no problem finished" in r.stderr  # (the stand-in writes no bench JSON)


def test_kernelbench_writes_few_files(tmp_path, fake_python):
    """The device machine returns at most 8 files a call: one run writes its log (each optimize's
    timed progress appended to it) and JSON, and a reports file only where there is a report."""
    kb, work, out = tmp_path / "level2", tmp_path / "work", tmp_path / "out"
    kb.mkdir()
    (kb / "7_Conv2d_ReLU.py").write_text("")
    (work / "runs" / "level2").mkdir(parents=True)
    (work / "7.json").write_text("{}")  # (as if the bench had written it: the stand-in writes nothing)
    (work / "runs" / "level2" / "7_Conv2d_ReLU.progress.log").write_text("[ 1.0 s] modes: any\n")
    r = run(["bash", str(SCRIPTS / "kernelbench.sh"), "l2", str(kb), "7"],
            env={**fake_python, "OUT": str(out), "WORK": str(work)})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["l2.log"]  # (the stand-in merges and reports nothing)
    log = (out / "l2.log").read_text()
    assert "== progress: " in log and "[ 1.0 s] modes: any" in log
    assert log.index("[ 1.0 s] modes: any") < log.rindex("args: scripts/bench_table.py")


def test_device_session_packs_results(tmp_path, fake_python):
    out, work = tmp_path / "out", tmp_path / "work"
    r = run(["bash", str(SCRIPTS / "device_session.sh"), "bf16 tf32", "2", "p.py"],
            env={**fake_python, "OUT": str(out), "WORK": str(work), "GPU_TESTS": "tests/test_x.py",
                 "FAKE_TEXT": "1 passed\\n"})
    assert r.returncode == 0, r.stderr
    summary = (out / "summary.txt").read_text()
    assert "== tests/test_x.py\n" in summary and "-m pytest -q -p no:cacheprovider tests/test_x.py" in summary
    assert "== bench bf16 (rc 0)" in summary and "== bench tf32 (rc 0)" in summary
    assert f"--precision tf32 --budget 2 --json {work}/bench_tf32.json" in summary
    with tarfile.open(out / "session.tgz") as tar:
        assert sorted(tar.getnames()) == ["bench_bf16.log", "bench_tf32.log", "test_x.log"]


@pytest.mark.parametrize("text, rc, verdict", [
    ("verify: PASS excess -1\\n", 0, "PASS"),
    ("kernelwright: the generated program FAILED verification; the original forward was kept\\n", 0, "FALLBACK"),
    ("eval mode: the generated forward (2.0 ms) is slower than eager (1.0 ms): ModelNew keeps the original forward"
     " there\\n", 0, "KEPT"),
    ("error: the model itself fails under bf16\\n", 2, "SKIP"),
    ("verify: FAIL excess 3\\n", 1, "FAIL"),
    ("Traceback\\n", 1, "ERROR"),
])
def test_cpu_sweep_verdicts(tmp_path, fake_python, text, rc, verdict):
    r = run(["bash", str(SCRIPTS / "cpu_sweep.sh"), "fp32"],
            env={**fake_python, "OUT": str(tmp_path / "sweep"), "FILES": "tests/fixtures/sweep/lstm_small.py",
                 "FAKE_TEXT": text, "FAKE_RC": str(rc)})
    assert r.stdout.startswith(f"fp32 lstm_small {verdict}")
    assert r.returncode == (0 if verdict in ("PASS", "KEPT", "SKIP") else 1)
    assert "optimize tests/fixtures/sweep/lstm_small.py" in (tmp_path / "sweep" / "fp32_lstm_small.log").read_text()


def test_train_bench_refuses_an_unknown_implementation_in_one_line(tmp_path):
    r = py("train_bench.py", "bf16", "4", "1", tmp_path / "out.json", "eager,fastest", "problems/level3/mlp.py")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "unknown implementation(s) fastest" in r.stderr
    assert not (tmp_path / "out.json").exists()


def test_rnn_registers_reports_each_selected_configs_registers_and_spills():
    """Compiled for sm_90 without a GPU: the fresh process must not be in interpreter mode."""
    r = py("rnn_registers.py", "problems/level3/gru.py", "--where", "WAVE=0,RESIDENT=0,DOT=fma,BLOCK_H=16,num_warps=4",
           env={"TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].endswith("1 selected") and len(lines) == 2
    kernels = ast.literal_eval(lines[1].split("} ", 1)[1])
    assert [k[0] for k in kernels] == ["gru_rnn_kernel"]
    name, error, registers, spills, shared = kernels[0]
    assert error is None and 0 < registers <= 255 and spills == 0 and shared > 0
    bad = py("rnn_registers.py", "problems/level3/gru.py", "--where", "BLOCK_H")
    assert bad.returncode == 2 and bad.stderr.startswith("rnn_registers.py: --where:") and bad.stderr.count("\n") == 1
