"""A stand-in for kernelwright.bench.runner._one in worker processes (tests/e2e/test_bench_runner.py):
problems named hang_once end their process as a hung kernel would the first time (a marker file
remembers it, as the trial database would remember the candidate), hang_always every time, crash_*
with exit code 3; the others return a row."""
import os
from pathlib import Path

from kernelwright.measure.watchdog import HANG_EXIT_CODE


def fake_one(path, opts):
    name = Path(path).stem
    marker = Path(opts["marker_dir"]) / name
    with open(Path(opts["marker_dir"]) / "calls.txt", "a") as fh:
        fh.write(f"{name} {os.environ.get('CUDA_VISIBLE_DEVICES')}\n")
    if name == "hang_always" or (name == "hang_once" and not marker.exists()):
        marker.touch()
        os._exit(HANG_EXIT_CODE)
    if name.startswith("crash"):
        os._exit(3)
    return {"problem": name, "path": path, "level": 1, "times": {"compile": 2.0, "kernelwright": 1.0},
            "correct": True}


def slow_one(path, opts):
    """Writes this worker's pid, then takes a minute."""
    import time

    (Path(opts["marker_dir"]) / "worker.pid").write_text(str(os.getpid()))
    time.sleep(60)
    return {"problem": Path(path).stem, "path": path, "level": 1}
