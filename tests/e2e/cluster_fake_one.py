"""A stand-in for kernelwright.bench.runner._one on Dask workers (tests/e2e/test_bench_cluster.py):
each call records two trials in the database it is given; a problem named die_once ends its worker
process in the middle of its first run (after its first trial; a marker file remembers it),
die_always in every run; the others return a row."""
import os
from pathlib import Path

from kernelwright.search.database import TrialDB


def trial(name: str, i: int) -> dict:
    return {"task_key": f"{name}/g0/fake", "config": {"template": "fake", "params": {"i": i, "pid": os.getpid()}}, "time_ms": 1.0 + i}


def fake_one(path, opts):
    name = Path(path).stem
    db = TrialDB(opts["db_path"])
    db.add(trial(name, 0))
    marker = Path(opts["marker_dir"]) / name
    if name == "die_always" or (name == "die_once" and not marker.exists()):
        marker.touch()
        os._exit(3)
    db.add(trial(name, 1))
    return {"problem": name, "path": path, "level": 1, "correct": True, "groups": [["g0", "pointwise", "fake"]],
            "pid": os.getpid()}
