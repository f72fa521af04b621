"""The trial database: an append-only JSON-lines file, one trial per line.

Each record: task_key, task_features, template, config (``Config.to_dict()``), time_ms,
error, excess, device, precision, version (kernelwright's), timestamp, and optionally extra.
The file is created on the first ``add``; a truncated or corrupt line (a crash mid-write)
is skipped when reading, and the next ``add`` starts on a fresh line.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from .. import __version__
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
    ``$KERNELWRIGHT_DB``, else ``$XDG_CACHE_HOME/kernelwright/trials.jsonl`` (that is
    ``~/.cache/kernelwright/trials.jsonl`` by default)."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kernelwright" / "trials.jsonl"


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


class TrialDB:
    """Append-only JSON-lines store of trials. Safe when the file does not exist yet."""

    def __init__(self, path: "str | os.PathLike | None" = None, priors: "Sequence[str | os.PathLike]" = ()):
        self.path = default_db_path(path)
        self.priors = [Path(p) for p in priors]  # read-only trial files (e.g. the packaged H200 trials)
        self.skipped_lines = 0  # corrupt lines seen by the last read

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
        rec, line = self._prepare(record)
        self._append(line)
        return rec

    def add_many(self, records) -> list[dict]:
        """Append several records in one write."""
        prepared = [self._prepare(r) for r in records]
        if prepared:
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

    # reading ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        self.skipped_lines = 0
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
        sources = [_prior_records(p) for p in self.priors] if include_priors else []
        for rec in itertools.chain(*sources, self):
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
