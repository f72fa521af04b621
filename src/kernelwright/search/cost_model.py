"""A learned cost model: predicts log(time) of a (task, config) pair with uncertainty.

Features are the config's parameters (log2 of positive ints, 0/1 for bools, one-hot for
strings, one-hot template) plus the caller's task features (numbers such as log2 numel,
row length, bytes, flops; strings are one-hot encoded). Because task features are part of
the input, trials of one task inform predictions for a similar one.

The model is a small random forest; the spread of its trees' predictions is the
uncertainty used by the model-based strategy. With too few records it is not fitted and
returns an uninformative prior (``fitted`` is False).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..space.config import Config
from .result import RunResult

FeatureFn = Callable[[Config], dict]
TASK_PREFIX = "task."


def config_features(config: Config) -> dict[str, float]:
    """Numeric features of a config's parameters and template."""
    out: dict[str, float] = {f"template={config.template}": 1.0}
    for name, value in config.params:
        if isinstance(value, bool):
            out[name] = 1.0 if value else 0.0
        elif isinstance(value, int):
            out[name] = math.log2(value) if value > 0 else float(value) - 1.0
        elif isinstance(value, float):
            out[name] = value
        else:
            out[f"{name}={value}"] = 1.0
    return out


def task_feature_dict(task_features: Optional[Mapping[str, Any]]) -> dict[str, float]:
    """Task features with a prefix; strings and bools become one-hot / 0-1 numbers."""
    out: dict[str, float] = {}
    for k, v in (task_features or {}).items():
        if isinstance(v, bool):
            out[TASK_PREFIX + k] = 1.0 if v else 0.0
        elif isinstance(v, (int, float, np.integer, np.floating)):
            if math.isfinite(float(v)):
                out[TASK_PREFIX + k] = float(v)
        elif v is not None:
            out[f"{TASK_PREFIX}{k}={v}"] = 1.0
    return out


# tile axes: a config's BLOCK_<X> tiles the task's log2_<X> extent
TILED = ("M", "N", "K", "R")


def tiling_features(feats: dict[str, float]) -> dict[str, float]:
    """What a tile size means for this task, from a pair's features: per axis, log2 of the tiles
    the extent splits into (``tiles.X`` = log2_X - log2(BLOCK_X), at least 0) and the share of the
    tile left over past the extent (``tail.X``, 0 when it divides), and log2 of the programs the
    output tiles make (``tiles.out``: the M and N tiles). Trials of a task of another size then
    say something about this one (the same tile count or tail behaves alike), where the raw block
    sizes and extents alone leave the forest to find the interaction. For a GEMM template's tile
    also log2 of its operand tiles in flight (``tile.smem``: (BLOCK_M + BLOCK_N) x BLOCK_K x
    num_stages elements, what shared memory bounds) and of the accumulators per thread
    (``tile.acc``): with them a replay of the measured surfaces (docs/benchmarks.md, "The backward's
    replay settles; the RNN wavefront measured") found a row-reduce GEMM's fastest tile, one config
    beside a failed one at the shared-memory limit, in about half the trials; on the convolution
    template (box and row loads) they did not help and are left out."""
    out: dict[str, float] = {}
    for x in TILED:
        extent, block = feats.get(f"{TASK_PREFIX}log2_{x}"), feats.get(f"BLOCK_{x}")
        if extent is None or block is None:
            continue
        out[f"tiles.{x}"] = max(0.0, extent - block)
        n, b = 2.0 ** extent, 2.0 ** block
        out[f"tail.{x}"] = (math.ceil(n / b) * b - n) / (math.ceil(n / b) * b)
    if "tiles.M" in out:
        out["tiles.out"] = out["tiles.M"] + out.get("tiles.N", 0.0)
    m, n, k = feats.get("BLOCK_M"), feats.get("BLOCK_N"), feats.get("BLOCK_K")
    gemm = any(name.startswith("template=") and "gemm" in name for name in feats)
    if gemm and m is not None and n is not None and k is not None:
        stages, warps = feats.get("num_stages", 0.0), feats.get("num_warps", 2.0)
        out["tile.smem"] = math.log2(2.0 ** m + 2.0 ** n) + k + stages  # log2 of the operand tiles in flight
        out["tile.acc"] = m + n - warps - 5.0  # log2 of accumulators per thread
    return out


def analytic_prior(feats: Mapping[str, float], sms: Optional[int] = None) -> float:
    """A hand-written estimate of how promising a config is for its task, from a pair's features
    alone (no measurement; lower is more promising, 0 where the config has no warps / threads or
    no BLOCK_ sizes). A tile that steps over a K axis (GEMM, convolution: ``BLOCK_K``) is compute
    bound: bigger output tiles reuse more operands, up to 128 x 256, and a 4-stage pipeline hides
    the loads. Any other tile is memory bound: about 8 elements per thread (two 16-byte vectors of
    float32) keeps loads wide without spilling registers. Both: where the device's `sms` is given,
    fewer programs than SMs leave SMs idle (one point per halving below it); every halving of a
    reduction row that does not fit the tile costs a pass."""
    if "num_warps" in feats:
        threads = 5.0 + feats["num_warps"]  # log2 of 32 x num_warps
    elif "threads" in feats:
        threads = feats["threads"]
    else:
        return 0.0
    blocks = [k for k in feats if k.startswith("BLOCK_") and k != "BLOCK_K"]
    if not blocks:
        return 0.0
    tile = sum(feats[k] for k in blocks) + feats.get("ROWS", 0.0)  # log2 of the elements a program holds
    if "BLOCK_K" in feats:
        score = -min(tile, 15.0) + abs(feats.get("num_stages", 2.0) - 2.0)  # (features hold log2 of 4 stages)
    else:
        score = abs(tile - threads - 3.0)
    programs = feats.get("tiles.out", feats.get("tiles.M"))
    if programs is not None and sms:
        programs += feats.get("SPLIT", 0.0) + feats.get("SPLIT_K", 0.0)
        score += max(0.0, math.log2(sms) - programs)
    return score + 0.5 * feats.get("tiles.R", 0.0)


def make_features(config: Config, task_features: Optional[Mapping[str, Any]] = None) -> dict[str, float]:
    """Features of a (config, task) pair: ``config_features``, prefixed task features and the
    ``tiling_features`` of the two."""
    feats = config_features(config)
    feats.update(task_feature_dict(task_features))
    feats.update(tiling_features(feats))
    return feats


def task_feature_fn(task_features: Optional[Mapping[str, Any]]) -> FeatureFn:
    """The feature function of one task (what strategies take): ``make_features`` with the task's
    features converted once."""
    fixed = task_feature_dict(task_features)

    def fn(config: Config) -> dict[str, float]:
        feats = config_features(config)
        feats.update(fixed)
        feats.update(tiling_features(feats))
        return feats

    return fn


@dataclass
class Sample:
    """One training example: features, time (None for a failed trial), and its task."""

    features: dict
    time_ms: Optional[float]
    group: str = ""


def record_sample(record: Mapping[str, Any]) -> Optional[Sample]:
    """A Sample from a trial-database record (None when the record is unusable)."""
    try:
        cfg = record["config"]
        cfg = cfg if isinstance(cfg, Config) else Config.from_json(cfg)
    except (KeyError, TypeError, ValueError):
        return None
    t = record.get("time_ms")
    ok = record.get("error") is None and t is not None and float(t) > 0
    return Sample(make_features(cfg, record.get("task_features")),
                  float(t) if ok else None, str(record.get("task_key", "")))


class CostModel:
    """Random-forest regression of log(time_ms) on config + task features.

    failures: "penalty" (a failed trial counts as ``failure_penalty`` times the slowest
    success of its task) or "exclude".
    """

    def __init__(self, n_estimators: int = 24, min_records: int = 3,
                 failures: str = "penalty", failure_penalty: float = 2.0,
                 seed: int = 0, max_samples: int = 4000):
        if failures not in ("penalty", "exclude"):
            raise ValueError("failures must be 'penalty' or 'exclude'")
        self.n_estimators = n_estimators
        self.min_records = min_records
        self.failures = failures
        self.failure_penalty = failure_penalty
        self.seed = seed
        self.max_samples = max_samples
        self.samples: list[Sample] = []
        self.fitted = False
        self._forest = None
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._prior = (0.0, 1.0)

    # data ---------------------------------------------------------------------------
    def fit(self, records: Iterable[Any]) -> "CostModel":
        """Fit on trial-database records (dicts) or Samples, replacing earlier data."""
        self.samples = []
        return self.update(records)

    def update(self, records: Iterable[Any]) -> "CostModel":
        """Add records (dicts or Samples) to the training data and refit."""
        for rec in records:
            s = rec if isinstance(rec, Sample) else record_sample(rec)
            if s is not None:
                self.samples.append(s)
        self._refit()
        return self

    def add_results(self, results: Iterable[RunResult], features: FeatureFn,
                    group: str = "") -> "CostModel":
        """Add RunResults of one task (features from ``features(config)``) and refit."""
        return self.update(Sample(features(r.config), r.time_ms if r.ok else None, group)
                           for r in results)

    @property
    def n_records(self) -> int:
        return len(self.samples)

    def _targets(self, samples: Sequence[Sample]) -> tuple[list[Sample], np.ndarray]:
        worst: dict[str, float] = {}
        for s in samples:
            if s.time_ms is not None:
                y = math.log(s.time_ms)
                worst[s.group] = max(worst.get(s.group, y), y)
        overall = max(worst.values()) if worst else 0.0
        keep, ys = [], []
        for s in samples:
            if s.time_ms is not None:
                keep.append(s)
                ys.append(math.log(s.time_ms))
            elif self.failures == "penalty" and worst:
                keep.append(s)
                ys.append(worst.get(s.group, overall) + math.log(self.failure_penalty))
        return keep, np.asarray(ys, dtype=float)

    def _refit(self) -> None:
        samples = self.samples[-self.max_samples:]
        keep, y = self._targets(samples)
        if len(y):
            self._prior = (float(y.mean()), float(y.std()) if len(y) > 1 and y.std() > 0 else 1.0)
        n_ok = sum(1 for s in keep if s.time_ms is not None)
        if len(keep) < self.min_records or n_ok == 0:
            self.fitted = False
            self._forest = None
            return
        names = sorted({k for s in keep for k in s.features})
        self._names = names
        self._index = {k: i for i, k in enumerate(names)}
        X = self._matrix([s.features for s in keep])
        from sklearn.ensemble import RandomForestRegressor

        forest = RandomForestRegressor(n_estimators=self.n_estimators, bootstrap=True,
                                       max_features=0.8, min_samples_leaf=1,
                                       random_state=self.seed, n_jobs=1)
        forest.fit(X, y)
        self._forest = forest
        self.fitted = True

    def _matrix(self, feats: Sequence[Mapping[str, float]]) -> np.ndarray:
        X = np.zeros((len(feats), len(self._names)), dtype=float)
        idx = self._index
        for i, f in enumerate(feats):
            for k, v in f.items():
                j = idx.get(k)
                if j is not None:
                    X[i, j] = v
        return X

    # prediction ---------------------------------------------------------------------
    def predict(self, features: "Sequence[Mapping[str, float]] | Mapping[str, float]"
                ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of predicted log(time_ms) for each feature dict."""
        if isinstance(features, Mapping):
            features = [features]
        n = len(features)
        if not self.fitted or n == 0:
            mean, std = self._prior
            return np.full(n, mean), np.full(n, std)
        X = self._matrix(features)
        per_tree = np.stack([t.predict(X) for t in self._forest.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)

    def predict_configs(self, configs: Sequence[Config],
                        task_features: Optional[Mapping[str, Any]] = None
                        ) -> tuple[np.ndarray, np.ndarray]:
        fn = task_feature_fn(task_features)
        return self.predict([fn(c) for c in configs])

    def rank(self, configs: Sequence[Config],
             task_features: Optional[Mapping[str, Any]] = None) -> list[Config]:
        """Configs ordered by predicted time, fastest first (input order when unfitted)."""
        if not self.fitted:
            return list(configs)
        mean, _ = self.predict_configs(configs, task_features)
        order = np.argsort(mean, kind="stable")
        return [configs[i] for i in order]

    def __repr__(self) -> str:
        return (f"CostModel(records={self.n_records}, fitted={self.fitted}, "
                f"features={len(self._names)})")
