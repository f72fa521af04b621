"""Search strategies replayed against measured surfaces: how many trials each needs to reach 95% and
99% of the fastest config of a unit.

A `Surface` is one unit's measured configs (task, template and precision; a config measured more
than once counts with its median time; a failed one with None). `replay` runs a strategy's ask /
tell loop against it, one config per trial, the surface answering each ask with its recorded
result, and returns the best-so-far time after every trial. `study` does that for every surface,
strategy and seed and summarises trials-to-95% / 99% of the surface's best (median over surfaces,
the spread over seeds).

The strategies (`STRATEGIES`): "random" (uniform order); "model-cold" (the cost-model strategy of
search/strategies.py with no earlier trials: its analytic prior's first pick, then picks spread over
the space until the model has its first records); "model-warm"
(the same model fitted first on the records of the *other* problems with the same template and
precision, as a search with the packaged priors starts); "recorded" (the order the surface was
measured in: the shipped search as it ran, seeds first). A surface holds only the configs that
earlier searches chose to measure, not the whole space, so the fastest of them stands for the best.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..analyze.device import lookup
from ..space.config import Config
from .cost_model import CostModel, task_feature_fn
from .evaluate import problem_of
from .result import RunResult
from .strategies import Exhaustive, ModelBased, RandomSearch, SeedsFirst, Strategy

STRATEGIES = ("random", "model-cold", "model-warm", "shipped", "recorded")


@dataclass
class Surface:
    """One unit's measured configs, in the order they were first measured."""

    task_key: str
    template: str
    precision: str
    task_features: dict
    times: dict[Config, Optional[float]] = field(default_factory=dict)  # None: the config failed
    seeds: list[Config] = field(default_factory=list)  # the unit's expert seeds in order, where records mark them
    device: str = ""  # the GPU that measured it (one surface per device: times of two GPUs never mix)

    @property
    def best(self) -> float:
        return min(t for t in self.times.values() if t is not None)

    @property
    def label(self) -> str:
        """precision:task:template, and @device where the records name one."""
        return f"{self.precision}:{self.task_key}:{self.template}" + (f"@{self.device}" if self.device else "")

    @property
    def problem(self) -> str:
        return problem_of(self.task_key)

    def result(self, config: Config) -> RunResult:
        t = self.times[config]
        return RunResult(config, time_ms=t, error=None if t is not None else "failed (recorded)")


def surfaces(records: Iterable[Mapping], *, min_configs: int = 20, precision: Optional[str] = None) -> list[Surface]:
    """The surfaces of a trial database's records with at least `min_configs` distinct configs, one
    of them successful (records of one task, template, precision and device; `precision` keeps one)."""
    by: dict[tuple, dict[Config, list[Optional[float]]]] = defaultdict(dict)
    feats: dict[tuple, dict] = {}
    seeds: dict[tuple, dict[Config, int]] = defaultdict(dict)
    for r in sorted(records, key=lambda r: r.get("timestamp") or 0.0):
        if precision is not None and r.get("precision") != precision:
            continue
        try:
            cfg = r["config"] if isinstance(r["config"], Config) else Config.from_json(r["config"])
        except (KeyError, TypeError, ValueError):
            continue
        key = (str(r.get("task_key", "")), cfg.template, str(r.get("precision")), str(r.get("device") or ""))
        t = r.get("time_ms")
        ok = r.get("error") is None and t is not None and float(t) > 0
        by[key].setdefault(cfg, []).append(float(t) if ok else None)
        feats.setdefault(key, dict(r.get("task_features") or {}))
        rank = (r.get("extra") or {}).get("seed_rank")
        if isinstance(rank, int):
            seeds[key][cfg] = rank
    out = []
    for key, runs in by.items():
        times = {c: (statistics.median(ok) if (ok := [t for t in ts if t is not None]) else None)
                 for c, ts in runs.items()}
        if len(times) >= min_configs and any(t is not None for t in times.values()):
            out.append(Surface(key[0], key[1], key[2], feats[key], times, sorted(seeds[key], key=seeds[key].get), key[3]))
    return sorted(out, key=lambda s: (s.precision, s.task_key, s.template, s.device))


def replay(strategy: Strategy, surface: Surface, trials: Optional[int] = None) -> list[float]:
    """Best-so-far time after each of `trials` trials (default: every config) of `strategy` on the
    surface (inf until the first success); the strategy is bound to the surface's configs."""
    configs = list(surface.times)
    strategy.bind(configs, task_feature_fn(surface.task_features), surface.task_key)
    best, curve = math.inf, []
    for _ in range(min(trials or len(configs), len(configs))):
        (cfg,) = strategy.ask(1)
        res = surface.result(cfg)
        strategy.tell([res])
        if res.ok:
            best = min(best, res.time_ms)
        curve.append(best)
    return curve


def trials_to(curve: Sequence[float], best: float, fraction: float) -> int:
    """The first trial (1-based) whose best-so-far is within `fraction` of `best` (its speed at
    least fraction x the best's: time <= best / fraction); len(curve) + 1 when none is."""
    for i, t in enumerate(curve):
        if t <= best / fraction * (1 + 1e-12):
            return i + 1
    return len(curve) + 1


def make_strategy(name: str, surface: Surface, records: Sequence[Mapping], seed: int,
                  model: Callable[[int], CostModel] = lambda seed: CostModel(seed=seed),
                  acquisition: Optional[Mapping[str, Any]] = None) -> Strategy:
    """Strategy `name` (one of STRATEGIES) for a replay of `surface`; "model-warm" fits its model
    on the `records` of other problems with the surface's template and precision. `acquisition`:
    ModelBased's `kappa`, `explore` and `prior` where they are not its defaults."""
    acq = dict(acquisition or {})
    spec = lookup(surface.device) if surface.device else None
    acq.setdefault("sms", spec.sms if spec else None)
    if name == "random":
        return RandomSearch(seed=seed)
    if name == "model-cold":
        return ModelBased(model(seed), seed=seed, **acq)
    if name in ("model-warm", "shipped"):
        prior = [r for r in records if r.get("precision") == surface.precision
                 and _template(r) == surface.template and problem_of(str(r.get("task_key", ""))) != surface.problem]
        warm = ModelBased(model(seed).fit(prior), seed=seed, **acq)
        return warm if name == "model-warm" else SeedsFirst(surface.seeds, warm)
    if name == "recorded":
        return Exhaustive()
    raise ValueError(f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")


def _template(record: Mapping) -> Optional[str]:
    """A record's template: its own field, else its config's."""
    if record.get("template"):
        return str(record["template"])
    cfg = record.get("config")
    try:
        return (cfg if isinstance(cfg, Config) else Config.from_json(cfg)).template
    except (TypeError, ValueError):
        return None


@dataclass
class StudyRow:
    """One strategy over every surface: per seed, the median over surfaces of the trials to reach
    each fraction of the best; `per_surface` the trials to 95% per surface, median over seeds, and
    `mean_surface` their mean over seeds."""

    strategy: str
    surfaces: int
    seeds: int
    to95: list[float]
    to99: list[float]
    per_surface: dict[str, float] = field(default_factory=dict)
    mean_surface: dict[str, float] = field(default_factory=dict)

    @property
    def median95(self) -> float:
        return statistics.median(self.to95)

    @property
    def median99(self) -> float:
        return statistics.median(self.to99)


def study(surfs: Sequence[Surface], records: Sequence[Mapping], *, strategies: Sequence[str] = STRATEGIES,
          seeds: Sequence[int] = (0, 1, 2), trials: Optional[int] = None,
          model: Callable[[int], CostModel] = lambda seed: CostModel(seed=seed),
          acquisition: Optional[Mapping[str, Any]] = None) -> list[StudyRow]:
    """Replay each strategy on each surface for each seed (a deterministic strategy once);
    `acquisition` as make_strategy's."""
    rows = []
    for name in strategies:
        runs = [0] if name == "recorded" else list(seeds)
        by_seed95, by_seed99 = [], []
        per: dict[str, list[int]] = defaultdict(list)
        for seed in runs:
            t95, t99 = [], []
            for s in surfs:
                curve = replay(make_strategy(name, s, records, seed, model, acquisition), s, trials)
                t95.append(trials_to(curve, s.best, 0.95))
                t99.append(trials_to(curve, s.best, 0.99))
                per[s.label].append(t95[-1])
            by_seed95.append(statistics.median(t95))
            by_seed99.append(statistics.median(t99))
        rows.append(StudyRow(name, len(surfs), len(runs), by_seed95, by_seed99,
                             {k: statistics.median(v) for k, v in per.items()},
                             {k: statistics.fmean(v) for k, v in per.items()}))
    return rows


@dataclass
class HardSummary:
    """One strategy on the surfaces where random search needs many trials: their count, the
    strategy's mean trials to 95% over them (each surface's mean over seeds), and the geometric
    mean over them of its trials over random's."""

    strategy: str
    units: int
    mean95: float
    ratio: float


def against_random(rows: Sequence[StudyRow], threshold: float = 6.0) -> list[HardSummary]:
    """Per strategy of a study that ran "random": the surfaces where random needed at least
    `threshold` trials to 95% (mean over seeds) and how the strategy did on them. The medians
    over all surfaces are dominated by flat ones, where any order is within 95% after a trial
    or two; these are the surfaces that tell strategies apart."""
    base = next((r for r in rows if r.strategy == "random"), None)
    if base is None:
        raise ValueError("against_random needs the study's 'random' row")
    hard = [k for k, v in base.mean_surface.items() if v >= threshold]
    out = []
    for r in rows:
        if not hard:
            out.append(HardSummary(r.strategy, 0, math.nan, math.nan))
            continue
        mine = [r.mean_surface[k] for k in hard]
        out.append(HardSummary(r.strategy, len(hard), statistics.fmean(mine),
                               statistics.geometric_mean([a / base.mean_surface[k] for a, k in zip(mine, hard)])))
    return out


__all__ = ["STRATEGIES", "Surface", "surfaces", "replay", "trials_to", "make_strategy", "StudyRow", "study", "HardSummary", "against_random"]
