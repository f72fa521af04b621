"""The hang guard (measure/watchdog.py): a candidate whose first run never finishes is recorded as
failed and ends the process with one line; the search never tries it again."""
import os
import subprocess
import sys
import textwrap
import threading
import time

from kernelwright.measure import watchdog
from kernelwright.search.plan_search import search_unit
from kernelwright.search import RunResult, TrialDB
from kernelwright.space.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_guard_fires_only_when_the_block_outlives_it():
    fired = threading.Event()
    with watchdog.guard(0.05, fired.set):
        time.sleep(0.3)
    assert fired.is_set()
    quiet = threading.Event()
    with watchdog.guard(5.0, quiet.set):
        pass
    time.sleep(0.05)
    assert not quiet.is_set()
    with watchdog.guard(None, quiet.set):  # no guard at all
        time.sleep(0.01)
    assert not quiet.is_set()


def test_a_hang_is_recorded_and_ends_the_process_with_one_line(tmp_path):
    db_path = tmp_path / "trials.jsonl"
    code = textwrap.dedent(f"""
        import time
        from kernelwright.measure import watchdog
        from kernelwright.search import RunResult, TrialDB
        from kernelwright.space.config import Config
        db = TrialDB({str(db_path)!r})
        cfg = Config.make("triton.gemm", BLOCK_M=128)
        record = lambda msg: db.add_result(RunResult.failure(cfg, watchdog.HANG, msg), "p/g0/t", device="GPU X")
        with watchdog.guard(0.2, lambda: watchdog.hang_exit("candidate X did not finish", record)):
            time.sleep(30)
        print("not reached")
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert time.time() - t0 < 25
    assert proc.returncode == watchdog.HANG_EXIT_CODE
    assert "not reached" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("kernelwright: error: candidate X did not finish; recorded as failed")
    (rec,) = TrialDB(db_path).records()
    assert rec["error"] == "hang: candidate X did not finish" and rec["task_key"] == "p/g0/t"


class _Tuner:
    """What `_search` needs of a tuner: space, seeds, run; it sets on_hang."""

    def __init__(self, space):
        self.space, self.seeds, self.ran, self.on_hang = space, space[:2], [], None

    def run(self, configs):
        self.ran += configs
        return [RunResult(c, 1.0 + i) for i, c in enumerate(configs)]


def test_search_skips_configs_that_hung_before_and_records_new_hangs(tmp_path):
    db = TrialDB(tmp_path / "trials.jsonl")
    space = [Config.make("triton.gemm", BLOCK_M=m) for m in (16, 32, 64, 128)]
    common = dict(db=db, task_key="p/g0/gemm", task_features={}, precision="bf16", device="GPU X")
    db.add_result(RunResult.failure(space[0], watchdog.HANG, "did not finish"), "p/g0/gemm", device="GPU X",
                  precision="bf16")
    db.add_result(RunResult.failure(space[1], watchdog.HANG, "did not finish"), "p/g0/gemm", device="GPU Y",
                  precision="bf16")  # another GPU: still tried here
    tuner = _Tuner(space)
    results = search_unit(tuner, None, None, common)
    assert space[0] not in tuner.ran and set(tuner.ran) == set(space[1:])
    assert {r.config for r in results} == set(space[1:])
    # the tuner now records a hang of its own under the search's task
    tuner.on_hang(space[2], "did not finish either")
    recs = [r for r in db.records(task_key="p/g0/gemm") if str(r["error"]).startswith("hang")]
    assert len(recs) == 3 and recs[-1]["device"] == "GPU X" and recs[-1]["precision"] == "bf16"
    again = _Tuner(space)
    search_unit(again, None, None, common)
    assert set(again.ran) == {space[1], space[3]}


def _relu_scale_group():
    """(graph, its one fusion group, the graph's values) of relu(x) * 2 on a [4, 8] input."""
    import torch

    from kernelwright.capture import capture
    from kernelwright.capture.execute import run_graph
    from kernelwright.plan import plan_graph
    from kernelwright.problem import from_module

    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(4, 8)
    graph = capture(from_module(Scale(), [x]))
    with torch.no_grad():
        env = run_graph(graph, Scale(), [x], keep=True)
    return graph, plan_graph(graph).groups[0], env


def test_a_tuner_arms_the_guard_around_a_candidates_first_run(tmp_path, monkeypatch):
    """On the timed path a candidate whose check outlives `hang_s` reaches `hang_exit` with its
    config named, and `on_hang` records it; untimed (no GPU) nothing is armed."""
    import torch

    from kernelwright.policy import get_policy
    from kernelwright.search.units import GroupTuner

    graph, group, env = _relu_scale_group()
    exits, recorded = [], []
    monkeypatch.setattr(watchdog, "hang_exit", lambda msg, record: (exits.append(msg), record(msg)))
    for timed in (False, True):
        tuner = GroupTuner(graph, group, env, get_policy("fp32"), torch.device("cpu"), tmp_path, timed)
        tuner.hang_s, tuner.on_hang = 0.05, (lambda cfg, msg: recorded.append((cfg, msg)))
        monkeypatch.setattr(tuner, "check", lambda ins, mod: time.sleep(0.4) or 0.0)
        monkeypatch.setattr("kernelwright.search.units._time_fns", lambda fns, device: {k: 1.0 for k in fns})
        tuner.run(tuner.seeds[:1])
        assert len(exits) == (1 if timed else 0)
    assert tuner.seeds[0].key() in exits[0] and "did not finish its first run" in exits[0]
    assert recorded == [(tuner.seeds[0], exits[0])]


def test_the_limit_comes_from_the_environment(monkeypatch):
    import pytest

    from kernelwright.errors import UserError

    monkeypatch.delenv("KERNELWRIGHT_HANG_S", raising=False)
    assert watchdog.limit_seconds() == watchdog.DEFAULT_SECONDS
    monkeypatch.setenv("KERNELWRIGHT_HANG_S", "60")
    assert watchdog.limit_seconds() == 60.0
    monkeypatch.setenv("KERNELWRIGHT_HANG_S", "0")  # off
    assert watchdog.limit_seconds() == 0.0
    for bad in ("soon", "-5", "nan", "inf"):
        monkeypatch.setenv("KERNELWRIGHT_HANG_S", bad)
        with pytest.raises(UserError, match="KERNELWRIGHT_HANG_S"):
            watchdog.limit_seconds()


def test_a_kernel_that_never_ends_is_stopped(tmp_path):
    """A Triton kernel spinning on a flag nobody sets (compiled on a GPU, interpreted on the CPU)
    under the guard: the process ends with the hang exit code and its one line."""
    import torch

    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    code = textwrap.dedent("""
        import os, torch, triton, triton.language as tl
        from kernelwright.measure import watchdog

        @triton.jit
        def spin(flag_ptr):
            while tl.load(flag_ptr, volatile=True) == 0:
                pass

        dev = "cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu"
        flag = torch.zeros(1, dtype=torch.int32, device=dev)
        with watchdog.guard(3.0, lambda: watchdog.hang_exit("spin did not finish")):
            spin[(1,)](flag)
            if dev == "cuda":
                torch.cuda.synchronize()
        print("not reached")
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), TRITON_INTERPRET="0" if on_gpu else "1")
    script = tmp_path / "spin.py"  # compiled @triton.jit functions need a source file
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == watchdog.HANG_EXIT_CODE, proc.stderr[-2000:]
    assert "not reached" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("kernelwright: error: spin did not finish")


def test_a_unit_measured_before_runs_its_stored_best_alone(tmp_path):
    """With reuse, a unit this device, precision and version measured before runs the fastest of its
    stored verified configs alone (timed and recorded again); another device's records, the packaged
    priors' and a failing stored config do not count, and without reuse the search runs in full."""
    from kernelwright import __version__
    from kernelwright.search.plan_search import stored_best

    db = TrialDB(tmp_path / "trials.jsonl")
    space = [Config.make("triton.gemm", BLOCK_M=m) for m in (16, 32, 64, 128)]
    common = dict(db=db, task_key="p/g0/gemm", task_features={}, precision="bf16", device="GPU X")
    assert stored_best(db, common, space) is None
    for cfg, ms, dev in ((space[0], 3.0, "GPU X"), (space[2], 1.5, "GPU X"), (space[3], 0.5, "GPU Y")):
        db.add_result(RunResult(cfg, ms), "p/g0/gemm", device=dev, precision="bf16")
    db.add_result(RunResult.failure(space[1], "wrong", "mismatch"), "p/g0/gemm", device="GPU X", precision="bf16")
    assert stored_best(db, common, space) == space[2]
    assert stored_best(db, common, space[:2]) == space[0]  # only configs of today's space
    assert all(r["version"] == __version__ for r in db.records())
    tuner = _Tuner(space)
    results = search_unit(tuner, None, None, {**common, "reuse": True})
    assert tuner.ran == [space[2]] and [r.config for r in results] == [space[2]]
    assert len(db.records(task_key="p/g0/gemm")) == 5  # the rerun is recorded too
    full = _Tuner(space)
    search_unit(full, None, None, {**common, "reuse": False})
    assert set(full.ran) == set(space)

    class Broken(_Tuner):  # the stored config fails now: the search runs after all
        def run(self, configs):
            self.ran += configs
            return [RunResult.failure(c, "wrong", "mismatch") if c == space[2] else RunResult(c, 2.0) for c in configs]

    broken = Broken(space)
    search_unit(broken, None, None, {**common, "reuse": True})
    assert broken.ran[0] == space[2] and set(broken.ran) == set(space)


def test_a_candidate_that_faults_the_gpu_is_recorded_and_never_tried_again(tmp_path, monkeypatch):
    """A candidate whose first run reports a lost CUDA context (an illegal instruction) reaches
    `hang_exit` on the timed path, is recorded as kind "fault" in the trial database, and later
    searches on that device leave it out; other errors stay ordinary crash results, and untimed
    runs never exit."""
    import torch

    from kernelwright.policy import get_policy
    from kernelwright.search.units import GroupTuner

    assert watchdog.is_device_fault(RuntimeError("CUDA error: an illegal instruction was encountered"))
    assert watchdog.is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not watchdog.is_device_fault(RuntimeError("CUDA error: out of memory"))
    assert not watchdog.is_device_fault(ValueError("illegal instruction"))

    graph, group, env = _relu_scale_group()
    db = TrialDB(tmp_path / "trials.jsonl")
    common = dict(db=db, task_key="p/g0/t", task_features={}, precision="fp32", device="GPU X")
    exits = []
    monkeypatch.setattr(watchdog, "hang_exit", lambda msg, record: (exits.append(msg), record(msg)))
    monkeypatch.setattr("kernelwright.search.units._time_fns", lambda fns, device: {k: 1.0 for k in fns})
    for timed in (False, True):
        tuner = GroupTuner(graph, group, env, get_policy("fp32"), torch.device("cpu"), tmp_path, timed)
        bad = tuner.space[0]

        def check(ins, mod, tuner=tuner, bad=bad):
            if tuner.modules.get(bad.key()) is mod:
                raise RuntimeError("CUDA error: an illegal instruction was encountered")
            return 0.0

        monkeypatch.setattr(tuner, "check", check)
        tuner.space, tuner.seeds = tuner.space[:3], [bad]
        results = search_unit(tuner, None, None, common)
        assert len(exits) == (1 if timed else 0)
        assert any(r.config == bad and r.error_kind == "crash" for r in results)
    assert bad.key() in exits[0] and "faulted the GPU" in exits[0]
    (rec,) = [r for r in db.records(task_key="p/g0/t") if str(r["error"]).startswith("fault")]
    assert rec["device"] == "GPU X"
    again = GroupTuner(graph, group, env, get_policy("fp32"), torch.device("cpu"), tmp_path, True)
    again.space, again.seeds = again.space[:3], [bad]
    ran = []
    monkeypatch.setattr(again, "run", lambda configs: ran.extend(configs) or [RunResult(c, 1.0) for c in configs])
    search_unit(again, None, None, common)
    assert bad not in ran and ran
