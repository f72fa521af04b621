"""bench --cluster on Dask distributed workers: a local cluster of two CPU workers benches the same
problems as the single-process bench, with the same results, on both workers; a worker that dies in
a problem loses no finished trial, the problem runs again and the bench completes; bad --cluster
values and an unreachable scheduler are one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from kernelwright.bench import cluster  # noqa: E402
from kernelwright.errors import UserError  # noqa: E402
from kernelwright.search.database import TrialDB  # noqa: E402

from cluster_fake_one import fake_one, trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMALL = [ROOT / "problems" / "level1" / f"{n}.py" for n in ("relu", "softmax", "gelu", "elu")]


def bench(tmp_path: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "kernelwright", "bench", *map(str, SMALL), "--device", "cpu",
                           "--small", "--budget", "1", "--out", str(tmp_path / name), "--db",
                           str(tmp_path / f"{name}.sqlite"), "--json", str(tmp_path / f"{name}.json"), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.interpreter
def test_a_local_cluster_benches_as_one_process_does_on_both_workers(tmp_path):
    one = bench(tmp_path, "single")
    two = bench(tmp_path, "cluster", "--cluster", "local:2")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    rows = {name: json.loads((tmp_path / f"{name}.json").read_text())["rows"] for name in ("single", "cluster")}

    def same(r):
        return r["problem"], r["level"], r["correct"], r.get("groups"), r.get("error")

    assert sorted(map(same, rows["cluster"])) == sorted(map(same, rows["single"]))
    assert all(r["correct"] for r in rows["single"]) and len(rows["single"]) == len(SMALL)
    assert all(set(r["stages"]) == {"eager", "capture", "tune", "emit and final checks"} for r in rows["single"])
    assert len({r["worker"] for r in rows["cluster"]}) == 2  # both workers benched problems
    summary = json.loads((tmp_path / "cluster.json").read_text())["summary"]["level1"]
    assert summary["correct"] == 1.0 and "kw_over_compile" not in summary  # untimed: no speedups
    lines = [ln for ln in two.stdout.splitlines() if ln.startswith("L1 ")]
    assert len(lines) == len(SMALL) and all(" yes " in ln for ln in lines)


def test_a_worker_lost_mid_problem_keeps_every_finished_trial(tmp_path):
    names = ["ok_a", "die_once", "ok_b", "die_always", "ok_c"]
    paths = [f"problems/level1/{n}.py" for n in names]
    db = tmp_path / "trials.sqlite"
    TrialDB(db).add(trial("earlier", 0))  # the user's trials before the bench
    rows: list[dict] = []
    opts = {"marker_dir": str(tmp_path), "device": "cpu"}
    cluster.run_cluster("local:2", paths, opts, rows.append, db_path=db, echo=lambda s: None, one=fake_one,
                        live=False)
    by = {r["problem"]: r for r in rows}
    assert sorted(by) == sorted(names) and len(rows) == len(names)
    assert all(by[n]["correct"] for n in names if n != "die_always")
    assert by["die_always"]["correct"] is False and by["die_always"]["error"].startswith("crash: the worker")
    trials = list(TrialDB(db))
    assert trials[0]["task_key"] == "earlier/g0/fake" and len(trials) == 1 + 2 * 3 + 3 + 2
    ran = {}
    for r in trials[1:]:
        ran.setdefault(r["task_key"].split("/")[0], []).append(r["config"]["params"]["i"])
    assert all(sorted(ran[n]) == [0, 1] for n in ("ok_a", "ok_b", "ok_c"))  # each trial merged once
    assert sorted(ran["die_once"]) == [0, 0, 1]  # the lost run's trial kept, then the whole rerun
    assert ran["die_always"] == [0, 0]  # both lost runs' trials (a hung candidate's record, say) kept
    assert len({r["worker"] for r in rows if r.get("worker")}) >= 2


def test_cluster_values_and_an_unreachable_scheduler_are_user_errors(monkeypatch):
    assert cluster.parse_cluster("local:3") == ("local", 3)
    assert cluster.parse_cluster("tcp://10.0.0.5:8786") == ("tcp", "tcp://10.0.0.5:8786")
    for bad in ("local:0", "local", "gpu:2", "tcp://host", "10.0.0.5:8786"):
        with pytest.raises(UserError, match="--cluster"):
            cluster.parse_cluster(bad)
    monkeypatch.setattr(cluster, "CONNECT_S", 1.0)
    with pytest.raises(UserError, match="no Dask scheduler answers"):
        cluster.run_cluster("tcp://127.0.0.1:9", ["x.py"], {"device": "cpu"}, lambda r: None, echo=lambda s: None)


def test_a_bad_cluster_value_is_one_line_and_exit_code_2(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-m", "kernelwright", "bench", str(SMALL[0]), "--device", "cpu",
                        "--cluster", "local:x", "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("kernelwright: error: --cluster"), p.stderr
