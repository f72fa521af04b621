"""Offline evaluation of the cost model on measured trials: does it rank the configs of a problem
it has never seen better as the number of trials it learned from grows?

Leave-one-problem-out over a trial database: records are pooled by (precision, template), the
pools ``tune`` fits on; for each problem of a pool (the first component of the task key, so every
unit and shape of a problem is held out together) a ``CostModel`` is fitted on ``n`` records of the
pool's other problems (a random subset; at ``n = 0`` the model is unfitted and keeps the held-out
configs' shuffled order: a pick by chance), and it ranks each held-out task's measured configs.
Per task:

- ``rho``: Spearman correlation of predicted and measured log time;
- ``regret1``: measured time of the predicted-fastest config over the fastest measured one;
- ``regret3``: the best measured time among the predicted three fastest, over the fastest.

A config measured several times (several sessions) counts once, at its median time; failed
trials are left out of the held-out sets (the model still learns from them). The held-out sets
are what earlier searches chose to measure, not a uniform sample of each space, so the numbers
compare training sizes with each other rather than promise a search's outcome.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from .cost_model import CostModel, record_sample


def problem_of(task_key: str) -> str:
    """The problem a task key belongs to (its first '/'-separated component)."""
    return task_key.split("/", 1)[0]


@dataclass(frozen=True)
class HeldOut:
    """One held-out task: its distinct configs' features and median measured times."""

    pool: tuple
    problem: str
    task_key: str
    features: tuple
    times: tuple


@dataclass(frozen=True)
class CurvePoint:
    """Averages over every held-out task at one training size."""

    n_train: int  # the size asked for
    train_mean: float  # records actually fitted on, averaged over held-out problems
    tasks: int
    rho: float
    regret1: float  # geometric mean
    regret3: float  # geometric mean


def _pools(records: Iterable[Mapping]) -> dict[tuple, list[Mapping]]:
    pools: dict[tuple, list[Mapping]] = defaultdict(list)
    for r in records:
        pools[(r.get("device"), r.get("precision"), r.get("template"))].append(r)
    return pools


def held_out_tasks(pool: tuple, records: Sequence[Mapping], min_configs: int,
                   rng: Optional[random.Random] = None) -> list[HeldOut]:
    """The pool's tasks with at least ``min_configs`` distinct successfully measured configs, each
    task's configs in an order shuffled by ``rng`` (measurement order when None)."""
    by_task: dict[str, dict[tuple, tuple[dict, list[float]]]] = defaultdict(dict)
    for r in records:
        s = record_sample(r)
        if s is None or s.time_ms is None:
            continue
        key = tuple(sorted(s.features.items()))
        by_task[s.group].setdefault(key, (s.features, []))[1].append(s.time_ms)
    out = []
    for task, configs in sorted(by_task.items()):
        if len(configs) >= min_configs:
            items = list(configs.values())
            if rng is not None:
                rng.shuffle(items)
            feats = tuple(f for f, _ in items)
            times = tuple(statistics.median(ts) for _, ts in items)
            out.append(HeldOut(pool, problem_of(task), task, feats, times))
    return out


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(float)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def score(model: CostModel, task: HeldOut) -> tuple[float, float, float]:
    """(rho, regret1, regret3) of ``model`` on one held-out task."""
    mean, _ = model.predict(list(task.features))
    order = np.argsort(mean, kind="stable")
    best = min(task.times)
    times = np.asarray(task.times)
    return (_spearman(mean, np.log(times)), float(times[order[0]] / best),
            float(times[order[:3]].min() / best))


def learning_curve(records: Iterable[Mapping], sizes: Sequence[int], *, min_configs: int = 6,
                   min_problems: int = 3, seed: int = 0, n_estimators: int = 24,
                   precision: Optional[str] = None) -> list[CurvePoint]:
    """Leave-one-problem-out scores at each training size (module docstring). Pools with fewer
    than ``min_problems`` problems are skipped; a size larger than a pool's other problems'
    records uses them all. Raises ValueError when no pool has a task to hold out."""
    pools = {k: v for k, v in _pools(records).items() if precision is None or k[1] == precision}
    per_size: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
    fitted: dict[int, list[int]] = {n: [] for n in sizes}
    rng = random.Random(seed)
    for pool, recs in sorted(pools.items(), key=lambda kv: tuple(map(str, kv[0]))):
        problems = sorted({problem_of(str(r.get("task_key", ""))) for r in recs})
        if len(problems) < min_problems:
            continue
        tasks = held_out_tasks(pool, recs, min_configs, rng)
        for problem in sorted({t.problem for t in tasks}):
            train = [r for r in recs if problem_of(str(r.get("task_key", ""))) != problem]
            mine = [t for t in tasks if t.problem == problem]
            for n in sizes:
                subset = rng.sample(train, n) if n < len(train) else train
                model = CostModel(n_estimators=n_estimators, seed=seed, max_samples=max(len(subset), 1))
                model.fit(subset if n > 0 else [])
                fitted[n].append(len(subset) if n > 0 else 0)
                per_size[n].extend(score(model, t) for t in mine)
    if not any(per_size.values()):
        raise ValueError("no task to hold out: need pools with at least "
                         f"{min_problems} problems and tasks with {min_configs}+ measured configs")
    out = []
    for n in sizes:
        rows = per_size[n]
        out.append(CurvePoint(n, float(np.mean(fitted[n])), len(rows), float(np.mean([r[0] for r in rows])),
                              math.exp(np.mean([math.log(r[1]) for r in rows])),
                              math.exp(np.mean([math.log(r[2]) for r in rows]))))
    return out
