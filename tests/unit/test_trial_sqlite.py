"""The SQLite trial store (search/database.py): WAL mode, priors imported once per file content
and kept apart from the user's trials, the JSON-lines default beside a new default database
imported as the user's own, a file that is not a database as one line."""
import json
import os
import sqlite3

import pytest

from kernelwright.errors import UserError
from kernelwright.search import RunResult, TrialDB, default_db_path
from kernelwright.space import Config


def _rec(task, ms=1.0, **params):
    return {"task_key": task, "template": "triton.row", "config": {"template": "triton.row", "params": params},
            "time_ms": ms, "error": None, "device": "GPU X", "precision": "fp32"}


def _write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_the_store_is_sqlite_in_wal_mode_and_its_state_follows_writes(tmp_path):
    db = TrialDB(tmp_path / "t.sqlite")
    assert db.sqlite and not db.path.exists() and list(db) == []
    before = db.state()
    db.add_result(RunResult(Config.make("triton.row", A=1), 0.5), "T", {"kind": "reduction"}, "GPU X", "fp32")
    assert db.state() != before
    with sqlite3.connect(db.path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [r["time_ms"] for r in db] == [0.5] and db.best("T", device="GPU X")["config"]["params"] == {"A": 1}


def test_priors_are_imported_once_kept_apart_and_replaced_when_their_file_changes(tmp_path):
    prior = tmp_path / "shipped.jsonl"
    _write_jsonl(prior, [_rec("p", 2.0, I=i) for i in range(5)])
    db = TrialDB(tmp_path / "mine.sqlite", priors=[prior])
    db.add(_rec("mine", 1.0))
    assert [r["task_key"] for r in db.records()] == ["mine"]  # results never come from priors
    assert db.best("p") is None and len(db.records(include_priors=True)) == 6
    with sqlite3.connect(db.path) as con:
        assert con.execute("SELECT count(*) FROM trials WHERE source = 'shipped.jsonl'").fetchone()[0] == 5
    assert len(TrialDB(db.path, priors=[prior]).records(include_priors=True)) == 6  # not imported twice
    assert len(TrialDB(db.path).records(include_priors=True)) == 1  # a handle without that prior
    _write_jsonl(prior, [_rec("q", 3.0)])
    os.utime(prior, ns=(1, 2))
    assert sorted(r["task_key"] for r in db.records(include_priors=True)) == ["mine", "q"]


def test_a_new_default_database_imports_the_json_lines_default_beside_it(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELWRIGHT_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    legacy = tmp_path / "kernelwright" / "trials.jsonl"
    legacy.parent.mkdir()
    _write_jsonl(legacy, [_rec("old", 0.7), _rec("old", 0.9, B=2)])
    db = TrialDB()
    assert db.path == default_db_path() and db.path.suffix == ".sqlite"
    assert db.best("old")["time_ms"] == 0.7  # a tuned problem's stored choice survives the change of store
    db.add(_rec("new"))
    assert len(TrialDB()) == 3  # imported once, not on every open


def test_a_file_that_is_not_a_database_is_one_line(tmp_path):
    bad = tmp_path / "trials.sqlite"
    bad.write_text("not a database\n" * 100)
    with pytest.raises(UserError, match="not a database.*jsonl"):
        TrialDB(bad).add(_rec("t"))


def test_an_unwritable_cache_still_reads_the_priors(tmp_path, monkeypatch):
    prior = tmp_path / "shipped.jsonl"
    _write_jsonl(prior, [_rec("p")])
    db = TrialDB(tmp_path / "ro" / "t.sqlite", priors=[prior])

    def refuse(*a, **k):
        raise sqlite3.OperationalError("unable to open database file")
    monkeypatch.setattr(sqlite3, "connect", refuse)
    assert [r["task_key"] for r in db.records(include_priors=True)] == ["p"]
    with pytest.raises(UserError, match="cannot be written: unable to open"):
        db.add(_rec("t"))
