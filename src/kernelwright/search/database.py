"""The trial database: every measured trial, one record each.

Each record: task_key, task_features, template, config (``Config.to_dict()``), time_ms,
error, excess, device, precision, version (kernelwright's), timestamp, and optionally extra.

Two stores behind one interface (`TrialDB`), chosen by the file name:

- SQLite in WAL mode (the default, ``trials.sqlite`` in the user's cache folder; any name not
  ending in ``.jsonl``): concurrent writers from several processes each commit whole records
  (one ``BEGIN IMMEDIATE`` transaction per write, waiting for the lock), readers never block
  them. Prior files (the packaged H200 trials) are imported into it on first use, once per file
  content, and kept apart from the user's own trials (`records(include_priors=...)`). A
  ``trials.jsonl`` beside a new default database is imported as the user's own trials when the
  database is created, so a cache folder holding JSON-lines trials keeps them.
- JSON lines (a name ending in ``.jsonl``): an append-only file, one record per line, created on
  the first ``add``; a truncated or corrupt line (a crash mid-write) is skipped when reading, and
  the next ``add`` starts on a fresh line. Prior files are read from disk (parsed once per
  process and file state).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from .. import __version__
from ..errors import UserError
from ..space.config import Config
from .result import RunResult

ENV_VAR = "KERNELWRIGHT_DB"


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[dict, ...]:
    return tuple(TrialDB(path))


def _prior_records(path) -> Iterator[dict]:
    """A prior file's records, parsed once per process (and again only when the file changes):
    the cost model of every unit reads the same few thousand shipped records."""
    try:
        st = os.stat(path)
    except OSError:
        return iter(())
    return (dict(r) for r in _parsed(str(path), st.st_mtime_ns, st.st_size))


def packaged_priors() -> list[Path]:
    """Trial files shipped with kernelwright (measured on the devices their records name)."""
    from importlib import resources

    folder = resources.files("kernelwright.search") / "data"
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".jsonl")) if folder.is_dir() else []


def default_db_path(explicit: "str | os.PathLike | None" = None) -> Path:
    """Where the trial database lives: ``explicit`` (e.g. ``--db``), else
    ``$KERNELWRIGHT_DB``, else ``$XDG_CACHE_HOME/kernelwright/trials.sqlite`` (that is
    ``~/.cache/kernelwright/trials.sqlite`` by default)."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return _cache_folder() / DEFAULT_NAME


DEFAULT_NAME = "trials.sqlite"
LEGACY_NAME = "trials.jsonl"  # the JSON-lines default a new default database imports


def _cache_folder() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kernelwright"


def is_jsonl(path: "str | os.PathLike") -> bool:
    """Whether a trial database path names the JSON-lines store (else SQLite)."""
    return str(path).endswith(".jsonl")


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats become None, unknown objects their str()."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _clean_float(x: Any) -> Optional[float]:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def make_record(result: RunResult, task_key: str, task_features: Optional[Mapping[str, Any]] = None,
                device: Optional[str] = None, precision: Optional[str] = None,
                **extra_fields: Any) -> dict:
    """The database record of one RunResult."""
    rec = {
        "task_key": task_key,
        "task_features": _jsonable(dict(task_features or {})),
        "template": result.config.template,
        "config": result.config.to_dict(),
        "time_ms": _clean_float(result.time_ms),  # may be set on a failure (e.g. wrong result)
        "error": result.error,
        "excess": _clean_float(result.excess),
        "device": device,
        "precision": precision,
        "version": __version__,
        "timestamp": time.time(),
    }
    if result.extra:
        rec["extra"] = _jsonable(result.extra)
    rec.update(_jsonable(extra_fields))
    return rec


def record_result(record: Mapping[str, Any]) -> RunResult:
    """A RunResult back from a database record."""
    return RunResult(Config.from_json(record["config"]), time_ms=record.get("time_ms"),
                     error=record.get("error"), excess=record.get("excess"),
                     extra=dict(record.get("extra") or {}))


def _is_ok(rec: Mapping[str, Any]) -> bool:
    t = rec.get("time_ms")
    return rec.get("error") is None and isinstance(t, (int, float)) and t > 0


BUSY_S = 60.0  # how long a writer waits for another's transaction before giving up

SCHEMA = """
CREATE TABLE IF NOT EXISTS trials (id INTEGER PRIMARY KEY, source TEXT NOT NULL, task_key TEXT NOT NULL,
                                   record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trials_by_task ON trials (task_key);
CREATE INDEX IF NOT EXISTS trials_by_source ON trials (source, id);
CREATE TABLE IF NOT EXISTS imports (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL);
"""
OWN = ""  # the source of the user's own trials; a prior's rows carry its file name


@functools.lru_cache(maxsize=16)
def _fingerprint(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@functools.lru_cache(maxsize=16)
def _sqlite_rows(path: str, source: str, token: tuple) -> tuple[dict, ...]:
    """The records of one source of an SQLite trial database in insertion order, parsed once per
    state of that source (`token`: its largest id and row count): the priors' thousands of records
    are parsed once per process however often the user's own trials change."""
    con = sqlite3.connect(path, timeout=BUSY_S)
    try:
        return tuple(json.loads(text) for (text,) in
                     con.execute("SELECT record FROM trials WHERE source = ? ORDER BY id", (source,)))
    finally:
        con.close()


def _token(con: sqlite3.Connection, source: str) -> tuple:
    return tuple(con.execute("SELECT max(id), count(*) FROM trials WHERE source = ?", (source,)).fetchone())


class TrialDB:
    """The trial store at `path` (SQLite, or JSON lines for a ``.jsonl`` name), created on the
    first write. `priors`: read-only trial files (e.g. the packaged H200 trials), used only by
    ``records(include_priors=True)``."""

    def __init__(self, path: "str | os.PathLike | None" = None, priors: "Sequence[str | os.PathLike]" = ()):
        self.path = default_db_path(path)
        self.priors = [Path(p) for p in priors]  # read-only trial files (e.g. the packaged H200 trials)
        self.skipped_lines = 0  # corrupt lines seen by the last read (JSON lines)
        self.sqlite = not is_jsonl(self.path)

    # writing ------------------------------------------------------------------------
    def _prepare(self, record: Mapping[str, Any]) -> tuple[dict, str]:
        rec = dict(record)
        if isinstance(rec.get("config"), Config):
            cfg = rec["config"]
            rec["config"] = cfg.to_dict()
            rec.setdefault("template", cfg.template)
        if "config" not in rec or "task_key" not in rec:
            raise ValueError("a trial record needs at least 'task_key' and 'config'")
        rec.setdefault("template", rec["config"].get("template"))
        rec.setdefault("version", __version__)
        rec.setdefault("timestamp", time.time())
        rec = _jsonable(rec)
        return rec, json.dumps(rec, sort_keys=True, allow_nan=False) + "\n"

    def add(self, record: Mapping[str, Any]) -> dict:
        """Append one record (a dict; missing version/timestamp are filled in)."""
        return self.add_many([record])[0]

    def add_many(self, records) -> list[dict]:
        """Append several records in one write (one transaction)."""
        prepared = [self._prepare(r) for r in records]
        if prepared:
            if self.sqlite:
                self._insert([(OWN, rec["task_key"], line.rstrip("\n")) for rec, line in prepared])
            else:
                self._append("".join(line for _, line in prepared))
        return [rec for rec, _ in prepared]

    def add_result(self, result: RunResult, task_key: str,
                   task_features: Optional[Mapping[str, Any]] = None,
                   device: Optional[str] = None, precision: Optional[str] = None,
                   **extra_fields: Any) -> dict:
        rec = make_record(result, task_key, task_features, device, precision, **extra_fields)
        return self.add(rec)

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: one write per record, so concurrent writers do not interleave lines.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size > 0:
                os.lseek(fd, size - 1, os.SEEK_SET)
                if os.read(fd, 1) != b"\n":  # previous writer died mid-line
                    line = "\n" + line
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    # the SQLite store -----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        """A connection in autocommit mode (transactions are explicit), the schema in place; a new
        default database imports the JSON-lines default beside it first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        try:
            con = sqlite3.connect(str(self.path), timeout=BUSY_S, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            con.executescript(SCHEMA)
        except sqlite3.OperationalError:
            raise  # (cannot open or lock: the callers say what they were doing)
        except sqlite3.DatabaseError as e:
            raise UserError(f"trial database {self.path}: {e} (a name ending in .jsonl is read as JSON lines)") from None
        legacy = self._legacy()
        if fresh and legacy is not None:
            self._import(con, legacy, OWN)
        return con

    def _legacy(self) -> Path | None:
        """The JSON-lines default beside a default-named database, when there is one."""
        legacy = self.path.with_name(LEGACY_NAME)
        return legacy if self.path.name == DEFAULT_NAME and legacy.is_file() else None

    def _insert(self, rows: list[tuple[str, str, str]]) -> None:
        try:
            con = self._connect()
        except (OSError, sqlite3.OperationalError) as e:
            raise UserError(f"trial database {self.path} cannot be written: {e} (--db or $KERNELWRIGHT_DB "
                            "names another)") from None
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.executemany("INSERT INTO trials (source, task_key, record) VALUES (?, ?, ?)", rows)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.close()

    def _import(self, con: sqlite3.Connection, path: Path, source: str) -> None:
        """Import a JSON-lines trial file once per content: as the prior `source` (its rows
        replaced when the file changed) or as own trials (OWN, imported once)."""
        try:
            st = path.stat()
        except OSError:
            return
        fp = _fingerprint(str(path), st.st_mtime_ns, st.st_size)
        name = f"{source or 'own'}:{path.name}"
        seen = con.execute("SELECT fingerprint FROM imports WHERE name = ?", (name,)).fetchone()
        if seen is not None and (source == OWN or seen[0] == fp):
            return  # (the common case: read without taking the write lock)
        con.execute("BEGIN IMMEDIATE")  # (another process importing the same file waits, then sees it done)
        try:
            row = con.execute("SELECT fingerprint FROM imports WHERE name = ?", (name,)).fetchone()
            if row is None or (source != OWN and row[0] != fp):
                if source != OWN:
                    con.execute("DELETE FROM trials WHERE source = ?", (source,))
                recs = TrialDB(path).records() if is_jsonl(path) else []
                con.executemany("INSERT INTO trials (source, task_key, record) VALUES (?, ?, ?)",
                                [(source, r["task_key"], json.dumps(r, sort_keys=True)) for r in recs])
                con.execute("INSERT OR REPLACE INTO imports (name, fingerprint) VALUES (?, ?)", (name, fp))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _rows(self, with_priors: bool) -> list[tuple[str, dict]]:
        """(source, record) of the user's trials and, `with_priors`, of this database's priors
        (imported first where they are new or changed)."""
        if not self.path.exists() and not with_priors and self._legacy() is None:
            return []
        try:
            con = self._connect()
        except (OSError, sqlite3.OperationalError) as e:
            if not with_priors:
                raise UserError(f"trial database {self.path} cannot be read: {e}") from None
            # (a cache folder this process cannot write: the priors straight from their files)
            return [(p.name, r) for p in self.priors for r in _prior_records(p)]
        try:
            sources = [OWN] + ([p.name for p in self.priors] if with_priors else [])
            if with_priors:
                for p in self.priors:
                    self._import(con, p, p.name)
            tokens = {src: _token(con, src) for src in sources}
        finally:
            con.close()
        return [(src, r) for src in sources for r in _sqlite_rows(str(self.path), src, tokens[src])]

    def state(self) -> tuple:
        """A token that changes whenever the stored trials do (for caches of fitted models)."""
        if self.sqlite:
            if not self.path.exists():
                return (str(self.path), None)
            con = self._connect()
            try:
                return (str(self.path), tuple(con.execute("SELECT max(id), count(*) FROM trials").fetchone()))
            finally:
                con.close()
        st = self.path.stat() if self.path.exists() else None
        return (str(self.path), st and (st.st_size, st.st_mtime_ns))

    # reading ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        """The user's own trials (never the priors), in the order they were added."""
        self.skipped_lines = 0
        if self.sqlite:
            yield from (dict(r) for src, r in self._rows(False) if src == OWN)
            return
        try:
            f = open(self.path, "r", encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    self.skipped_lines += 1
                    continue
                if isinstance(rec, dict) and "config" in rec and "task_key" in rec:
                    yield rec
                else:
                    self.skipped_lines += 1

    def records(self, template: Optional[str] = None, device: Optional[str] = None,
                task_key: Optional[str] = None, precision: Optional[str] = None,
                ok_only: bool = False, include_priors: bool = False) -> list[dict]:
        """Records, optionally filtered (a filter left as None matches everything). Prior files
        are read only with `include_priors` (for fitting cost models, never for results)."""
        out = []
        if self.sqlite:
            names = {OWN} | ({p.name for p in self.priors} if include_priors else set())
            rows: Iterator[dict] = (dict(r) for src, r in self._rows(include_priors and bool(self.priors)) if src in names)
        else:
            sources = [_prior_records(p) for p in self.priors] if include_priors else []
            rows = itertools.chain(*sources, self)
        for rec in rows:
            if template is not None and rec.get("template") != template:
                continue
            if device is not None and rec.get("device") != device:
                continue
            if task_key is not None and rec.get("task_key") != task_key:
                continue
            if precision is not None and rec.get("precision") != precision:
                continue
            if ok_only and not _is_ok(rec):
                continue
            out.append(rec)
        return out

    def best(self, task_key: str, device: Optional[str] = None,
             precision: Optional[str] = None) -> Optional[dict]:
        """The fastest successful record of a task, or None."""
        recs = self.records(task_key=task_key, device=device, precision=precision, ok_only=True)
        return min(recs, key=lambda r: r["time_ms"]) if recs else None

    def results(self, task_key: str, device: Optional[str] = None,
                precision: Optional[str] = None) -> list[RunResult]:
        return [record_result(r) for r in
                self.records(task_key=task_key, device=device, precision=precision)]

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"TrialDB({str(self.path)!r})"
