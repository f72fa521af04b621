"""bench's worker supervision: a worker ended by a hung kernel is restarted, the problem retried
once (the hung candidate is then recorded and skipped), other problems go on."""
from kernelwright.bench.runner import run_workers, summarise

from bench_fake_one import fake_one


def test_workers_restart_after_a_hang_and_the_bench_goes_on(tmp_path):
    rows = []
    names = ["ok_a", "hang_once", "hang_always", "crash_b", "ok_c"]
    groups = [[f"problems/level1/{n}.py" for n in names], ["problems/level1/ok_d.py"]]
    run_workers(groups, {"marker_dir": str(tmp_path)}, rows.append, one=fake_one)
    by = {r["problem"]: r for r in rows}
    assert sorted(by) == sorted(names + ["ok_d"]) and len(rows) == 6
    assert [r["problem"] for r in rows if r["path"].split("/")[-1][:-3] in names] == names  # list order kept
    assert by["hang_once"].get("correct") and "error" not in by["hang_once"]  # retried, then benched
    assert by["hang_always"]["error"].startswith("hang:") and by["hang_always"]["correct"] is False
    assert by["crash_b"]["error"] == "crash: the worker process died (exit code 3)"
    assert by["ok_c"]["correct"] and by["ok_d"]["correct"]
    calls = (tmp_path / "calls.txt").read_text().split("\n")
    assert calls.count("hang_once 0") == 2 and calls.count("hang_always 0") == 2 and calls.count("crash_b 0") == 1
    assert "ok_d 1" in calls  # the second list ran as GPU 1
    s = summarise(rows, baseline_only=False)["level1"]  # error rows count in their level, as failures
    assert s["n"] == 6 and s["correct"] == 4 / 6 and s["kw_over_compile"] == 2.0


def _slow_bench(tmp_path, interrupted_exit: bool = False, **popen):
    """A bench (a script of its own) whose one worker takes a minute over its problem, started with
    `popen`; returns (the bench process, the worker's pid once it has started). With
    `interrupted_exit` the bench answers Ctrl-C with the one line "interrupted", as the CLI does."""
    import os
    import subprocess
    import sys
    import time

    here = os.path.dirname(os.path.abspath(__file__))
    call = "run_workers([['p/level1/a.py']], {'marker_dir': %r}, print, one=slow_one)" % str(tmp_path)
    main = (f"    try:\n        {call}\n    except KeyboardInterrupt:\n        sys.exit('interrupted')\n"
            if interrupted_exit else f"    {call}\n")
    code = ("import sys; sys.path[:0] = [%r, %r]\n"
            "from kernelwright.bench.runner import run_workers\n"
            "from bench_fake_one import slow_one\n"
            "if __name__ == '__main__':\n" % (here, os.path.join(os.path.dirname(os.path.dirname(here)), "src"))) + main
    script = tmp_path / "bench.py"
    script.write_text(code)
    bench = subprocess.Popen([sys.executable, str(script)], **popen)
    pid_file = tmp_path / "worker.pid"
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert pid_file.exists()
    return bench, int(pid_file.read_text())


def test_workers_end_when_the_bench_is_killed(tmp_path):
    """A bench killed from outside (a time limit) takes its worker with it within a second or so,
    instead of leaving it on the GPU."""
    import os
    import signal
    import time

    bench, worker = _slow_bench(tmp_path)
    bench.send_signal(signal.SIGKILL)
    bench.wait()
    for _ in range(100):  # 10 s at most
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        try:  # a zombie (exited, not yet reaped) counts as gone
            with open(f"/proc/{worker}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the worker outlived its bench")


def test_ctrl_c_ends_the_workers_without_a_traceback(tmp_path):
    """Ctrl-C at a terminal interrupts the bench's whole process group: the bench says so once, its
    workers end quietly (no traceback from inside a problem)."""
    import os
    import signal
    import subprocess

    # (SIGINT as a terminal leaves it: a test runner's worker may ignore it, and a child inherits that)
    bench, _ = _slow_bench(tmp_path, interrupted_exit=True, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.killpg(bench.pid, signal.SIGINT)
    _, err = bench.communicate(timeout=90)  # (a bound for a hang: a loaded 2-core machine is slow to unwind)
    assert bench.returncode == 1 and err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err, err
