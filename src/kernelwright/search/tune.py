"""The tuning loop: ask a batch, run it, tell the results, record them; stop at the first
budget reached (trials or seconds) or when the candidates are exhausted.

``run`` belongs to the caller: it may compile in parallel, apply time-outs and verify; it
returns one RunResult per config. If it raises, the whole batch is recorded as crashed
(failures are results, not exceptions).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..analyze.device import lookup
from ..space.config import Config
from .cost_model import CostModel, task_feature_fn
from .database import TrialDB, make_record, record_result
from .result import CRASH, RunResult
from .strategies import ModelBased, Strategy, choose_strategy

Runner = Callable[[list[Config]], list[RunResult]]


class CandidateCache:
    """Results already known, keyed by (task_key, config.key()), so a candidate is not
    run twice."""

    def __init__(self) -> None:
        self._store: dict[tuple[str, str], RunResult] = {}

    @staticmethod
    def _key(task_key: str, config: "Config | str") -> tuple[str, str]:
        return (task_key, config if isinstance(config, str) else config.key())

    def get(self, task_key: str, config: "Config | str") -> Optional[RunResult]:
        return self._store.get(self._key(task_key, config))

    def put(self, task_key: str, result: RunResult) -> None:
        self._store[self._key(task_key, result.config)] = result

    def __contains__(self, item: tuple[str, "Config | str"]) -> bool:
        return self._key(*item) in self._store

    def __len__(self) -> int:
        return len(self._store)

    @classmethod
    def from_db(cls, db: TrialDB, task_key: Optional[str] = None, device: Optional[str] = None,
                precision: Optional[str] = None, include_failures: bool = True,
                retry_timeouts: bool = True) -> "CandidateCache":
        """A cache of the records in ``db`` (the latest record of a candidate wins;
        time-outs are left out so they are retried unless ``retry_timeouts`` is False)."""
        cache = cls()
        for rec in db.records(task_key=task_key, device=device, precision=precision):
            try:
                res = record_result(rec)
            except (KeyError, TypeError, ValueError):
                continue
            if not res.ok:
                if not include_failures or (retry_timeouts and res.error_kind == "timeout"):
                    continue
            cache.put(str(rec.get("task_key", "")), res)
        return cache


@dataclass
class TuneResult:
    best: Optional[RunResult]
    results: list[RunResult] = field(default_factory=list)
    n_run: int = 0            # trials run through `run` (cache hits not counted)
    n_cached: int = 0         # results served from the cache
    elapsed_s: float = 0.0
    stopped: str = ""         # "trials", "time" or "exhausted"
    strategy: str = ""

    @property
    def n_failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    @property
    def ok_results(self) -> list[RunResult]:
        return [r for r in self.results if r.ok]


def _best(results: Iterable[RunResult]) -> Optional[RunResult]:
    ok = [r for r in results if r.ok]
    return min(ok, key=lambda r: r.time_ms) if ok else None


def _safe_run(run: Runner, configs: list[Config]) -> list[RunResult]:
    try:
        out = list(run(list(configs)) or [])
    except Exception as exc:  # a runner bug or crash is a failed trial, not a failed tune
        msg = f"runner raised {type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        return [RunResult.failure(c, CRASH, msg) for c in configs]
    if len(out) == len(configs) and all(isinstance(r, RunResult) and r.config == c
                                        for r, c in zip(out, configs)):
        return out
    by_config = {r.config: r for r in out if isinstance(r, RunResult)}
    return [by_config.get(c) or RunResult.failure(c, CRASH, "runner returned no result")
            for c in configs]


def tune(candidates: Sequence[Config], run: Runner, budget_trials: Optional[int] = None,
         budget_s: Optional[float] = None, strategy: Optional[Strategy] = None,
         db: Optional[TrialDB] = None, task_key: str = "", task_features: Optional[Mapping[str, Any]] = None,
         *, batch_size: int = 8, cache: Optional[CandidateCache] = None,
         cost_model: Optional[CostModel] = None, device: Optional[str] = None,
         precision: Optional[str] = None, seed: int = 0,
         clock: Callable[[], float] = time.monotonic,
         on_result: Optional[Callable[[RunResult], None]] = None) -> TuneResult:
    """Search ``candidates`` with ``strategy`` (chosen by ``choose_strategy`` when None,
    with a cost model fitted on ``db``'s records of the same device and precision).

    Stops when ``budget_trials`` trials have run, when ``budget_s`` seconds have passed
    (checked between batches; a batch is shrunk to what the remaining time should allow),
    or when every candidate has been tried. Every new result is appended to ``db``; results
    found in ``cache`` are told to the strategy without running and do not count as trials.
    ``clock`` is injectable for tests.
    """
    if budget_trials is not None and budget_trials < 0:
        raise ValueError("budget_trials must be >= 0")
    if budget_s is not None and budget_s < 0:
        raise ValueError("budget_s must be >= 0")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")

    start = clock()
    unique = list(dict.fromkeys(candidates))
    def db_records() -> list[dict]:
        templates = {c.template for c in unique}
        return [r for r in db.records(device=device, precision=precision, include_priors=True)
                if r.get("template") in templates]

    if strategy is None:
        if cost_model is None and db is not None:
            cost_model = CostModel(seed=seed).fit(db_records())
        spec = lookup(device) if device else None
        strategy = choose_strategy(len(unique), budget_trials, cost_model, seed=seed, sms=spec.sms if spec else None)
    elif isinstance(strategy, ModelBased) and strategy.model.n_records == 0 and db is not None:
        strategy.model.fit(db_records())  # an empty model learns from the database first
    if not strategy.bound:
        strategy.bind(unique, task_feature_fn(task_features), task_key)

    results: list[RunResult] = []
    n_run = n_cached = 0
    stopped = "exhausted"
    while True:
        elapsed = clock() - start
        if budget_trials is not None and n_run >= budget_trials:
            stopped = "trials"
            break
        if budget_s is not None and elapsed >= budget_s:
            stopped = "time"
            break
        n = batch_size
        if budget_trials is not None:
            n = min(n, budget_trials - n_run)
        if budget_s is not None and n_run > 0:
            per_trial = elapsed / n_run
            if per_trial > 0:
                n = max(1, min(n, int((budget_s - elapsed) / per_trial)))
        batch = strategy.ask(n)
        if not batch:
            stopped = "exhausted"
            break

        known: dict[Config, RunResult] = {}
        if cache is not None:
            for c in batch:
                hit = cache.get(task_key, c)
                if hit is not None:
                    known[c] = hit
        to_run = [c for c in batch if c not in known]
        fresh = _safe_run(run, to_run) if to_run else []
        n_run += len(fresh)
        n_cached += len(known)
        fresh_by = dict(zip(to_run, fresh))
        batch_results = [known.get(c) or fresh_by[c] for c in batch]

        strategy.tell(batch_results)
        results.extend(batch_results)
        if db is not None and fresh:
            db.add_many(make_record(r, task_key, task_features, device, precision) for r in fresh)
        if cache is not None:
            for r in fresh:
                cache.put(task_key, r)
        if on_result is not None:
            for r in batch_results:
                on_result(r)

    return TuneResult(best=_best(results), results=results, n_run=n_run, n_cached=n_cached,
                      elapsed_s=clock() - start, stopped=stopped,
                      strategy=getattr(strategy, "name", type(strategy).__name__))
