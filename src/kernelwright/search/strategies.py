"""Ask/tell search strategies over a list of candidate configs.

    strategy = ModelBased(CostModel()).bind(candidates, features)
    while batch := strategy.ask(8):
        strategy.tell(run(batch))

``ask`` never returns a config it returned before; it returns [] once every candidate has
been asked. ``tell`` takes RunResults (failures included).
"""
from __future__ import annotations

import functools
import random
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from ..space.config import Config
from .cost_model import TASK_PREFIX, CostModel, FeatureFn, analytic_prior, config_features
from .result import RunResult


class Strategy:
    """Base class: keeps the candidate list and the set of configs already asked."""

    name = "strategy"

    def __init__(self, candidates: Optional[Sequence[Config]] = None,
                 features: Optional[FeatureFn] = None, task_key: str = ""):
        self.candidates: Optional[list[Config]] = None
        self.features: FeatureFn = features or config_features
        self.task_key = task_key
        self._asked: set[Config] = set()
        self.results: list[RunResult] = []
        if candidates is not None:
            self.bind(candidates, features, task_key)

    @property
    def bound(self) -> bool:
        return self.candidates is not None

    def bind(self, candidates: Sequence[Config], features: Optional[FeatureFn] = None,
             task_key: Optional[str] = None) -> "Strategy":
        """Set the candidates (duplicates dropped, order kept) and reset what was asked."""
        seen: set[Config] = set()
        self.candidates = [c for c in candidates if not (c in seen or seen.add(c))]
        if features is not None:
            self.features = features
        if task_key is not None:
            self.task_key = task_key
        self._asked = set()
        self.results = []
        return self

    def _require_bound(self) -> list[Config]:
        if self.candidates is None:
            raise RuntimeError(f"{type(self).__name__}: call bind(candidates) before ask()")
        return self.candidates

    def unasked(self) -> list[Config]:
        return [c for c in self._require_bound() if c not in self._asked]

    @property
    def remaining(self) -> int:
        return len(self._require_bound()) - len(self._asked)

    @property
    def done(self) -> bool:
        return self.remaining <= 0

    def ask(self, n: int) -> list[Config]:
        if n <= 0:
            return []
        picks = self._pick(self.unasked(), n)[:n]
        self._asked.update(picks)
        return picks

    def _pick(self, pool: list[Config], n: int) -> list[Config]:  # pragma: no cover
        raise NotImplementedError

    def tell(self, results: Iterable[RunResult]) -> None:
        self.results.extend(results)

    def __repr__(self) -> str:
        n = len(self.candidates) if self.candidates is not None else "unbound"
        return f"{type(self).__name__}(candidates={n}, asked={len(self._asked)})"


class Exhaustive(Strategy):
    """Every candidate, in the given order."""

    name = "exhaustive"

    def _pick(self, pool, n):
        return pool[:n]


class RandomSearch(Strategy):
    """Uniformly random order, without repeats."""

    name = "random"

    def __init__(self, seed: int = 0, candidates=None, features=None, task_key: str = ""):
        self.seed = seed
        self.rng = random.Random(seed)
        super().__init__(candidates, features, task_key)

    def _pick(self, pool, n):
        return self.rng.sample(pool, min(n, len(pool)))


class ModelBased(Strategy):
    """Bayesian-style search with a cost model.

    Each unasked config gets a predicted mean and std of log(time) (spread across the
    forest's trees); picks go by lower confidence bound ``mean - kappa * std``, configs the model
    scores alike in the order of the analytic ``prior``, with a share ``explore`` of uniformly
    random picks. Before the model has data (and when it was not pre-fitted on earlier trials) the
    first pick of a search is the config the prior ranks first and the next ones spread over the
    prior's most promising ``spread_share`` of the space: each the config farthest from every
    config asked so far (in the configs' standardised features), so the model's first records span
    the likely-fast configs rather than a corner of them, or the whole space's slow ones. Results
    told are added to the model, which is refitted. ``prior`` maps a config's features to a score,
    lower more promising (default `analytic_prior`: hand-written, from no measurement, given the
    device's ``sms``); None leaves the order to the model alone and makes the first pick random.

    The defaults (kappa 0: the predicted mean alone; a fifth of the picks random) come from
    replays on measured surfaces (docs/benchmarks.md, "Search strategies on sampled spaces"): the
    trees' spread is no calibrated uncertainty, and ranking by it sent the search to configs the
    forest knew least rather than those likely fast; the random share keeps a model that has not
    yet seen the fast region from exploiting a poor one. The prior matters where the model knows
    least: a forest fitted on a few records gives whole regions one value, and the prior orders
    the configs within them. ``spread_share`` 0.25: in a cold replay of the measured surfaces the
    quarter took the hard units to 0.28 of random's trials to 95% (0.31 spreading over the whole
    space; 0.29 for a tenth, 0.34 for half), better on both halves of them (docs/benchmarks.md,
    "A cold search's first records").
    """

    name = "model"

    def __init__(self, cost_model: Optional[CostModel] = None, explore: float = 0.2,
                 seed: int = 0, kappa: float = 0.0, candidates=None, features=None,
                 task_key: str = "", prior: Optional[Callable[[dict], float]] = analytic_prior,
                 sms: Optional[int] = None, spread_share: float = 0.25):
        if not 0.0 <= explore <= 1.0:
            raise ValueError("explore must be within [0, 1]")
        if not 0.0 < spread_share <= 1.0:
            raise ValueError("spread_share must be within (0, 1]")
        self.spread_share = spread_share
        self.model = cost_model if cost_model is not None else CostModel(seed=seed)
        self.explore = explore
        self.kappa = kappa
        # (the analytic prior counts programs against the device's SMs where `sms` is given)
        self.prior = functools.partial(analytic_prior, sms=sms) if prior is analytic_prior else prior
        self._prior_cache: dict[Config, float] = {}
        self.seed = seed
        self.rng = random.Random(seed)
        self._feat_cache: dict[Config, dict] = {}
        super().__init__(candidates, features, task_key)

    def bind(self, candidates, features=None, task_key=None):
        self._feat_cache = {}
        self._prior_cache = {}
        return super().bind(candidates, features, task_key)

    def _feats(self, config: Config) -> dict:
        f = self._feat_cache.get(config)
        if f is None:
            f = self._feat_cache[config] = self.features(config)
        return f

    def prior_scores(self, pool: Sequence[Config]) -> np.ndarray:
        """The prior's score per config (0 for all without a prior)."""
        if self.prior is None:
            return np.zeros(len(pool))
        out = []
        for c in pool:
            p = self._prior_cache.get(c)
            if p is None:
                p = self._prior_cache[c] = float(self.prior(self._feats(c)))
            out.append(p)
        return np.asarray(out, dtype=float)

    def scores(self, pool: Sequence[Config]) -> np.ndarray:
        """Lower confidence bound of log(time) per config (lower is more promising)."""
        mean, std = self.model.predict([self._feats(c) for c in pool])
        return mean - self.kappa * std

    def _pick(self, pool, n):
        n = min(n, len(pool))
        if not self.model.fitted:
            return self._spread(pool, n)
        # the model's ranking; configs it scores alike (a forest fitted on a few records gives whole
        # regions one value) in the prior's order rather than the candidates'
        order = list(np.lexsort((self.prior_scores(pool), self.scores(pool))))
        chosen: list[int] = []
        taken: set[int] = set()
        for _ in range(n):
            if self.rng.random() < self.explore:
                rest = [i for i in range(len(pool)) if i not in taken]
                i = self.rng.choice(rest)
            else:
                while order[0] in taken:
                    order.pop(0)
                i = int(order.pop(0))
            taken.add(i)
            chosen.append(i)
        return [pool[i] for i in chosen]

    def _spread(self, pool: list[Config], n: int) -> list[Config]:
        """n picks from `pool` before the model has data: a search's first the config the prior
        ranks first (ties at random), then farthest-point picks: each the config whose nearest
        asked config (those asked before and the picks so far) is farthest, in the features of the
        configs themselves (a task's own features are the same for all) standardised over pool and
        asked. Without a prior the first pick is random."""
        asked = [c for c in self._require_bound() if c in self._asked]
        chosen: list[Config] = []
        if not asked and self.prior is not None:
            prior = self.prior_scores(pool)
            best = np.flatnonzero(prior == prior.min())
            first = pool[int(best[self.rng.randrange(len(best))])]
            chosen.append(first)
            pool = [c for c in pool if c != first]
            asked = [first]
        if self.prior is not None and self.spread_share < 1.0 and len(pool) > n - len(chosen):
            # spread over the prior's most promising share only: the model's first records then
            # span the configs likely fast rather than the whole space
            prior = self.prior_scores(pool)
            cut = np.quantile(prior, self.spread_share)
            pool = [c for c, p in zip(pool, prior) if p <= cut] or pool
        return chosen + self._farthest(pool, asked, n - len(chosen))

    def _farthest(self, pool: list[Config], asked: list[Config], n: int) -> list[Config]:
        """n farthest-point picks from `pool` given the configs `asked` (the first at random where
        none was asked)."""
        if n <= 0:
            return []
        feats = [self._feats(c) for c in pool + asked]
        names = sorted({k for f in feats for k in f if not k.startswith(TASK_PREFIX)})
        a = np.array([[f.get(k, 0.0) for k in names] for f in feats], dtype=float)
        a = (a - a.mean(axis=0)) / (a.std(axis=0) + 1e-9)
        x = a[:len(pool)]
        nearest = np.full(len(pool), np.inf)
        for row in a[len(pool):]:
            nearest = np.minimum(nearest, ((x - row) ** 2).sum(axis=1))
        chosen: list[int] = []
        while len(chosen) < n:
            if not chosen and not asked:
                i = self.rng.randrange(len(pool))
            else:
                gap = nearest.copy()
                gap[chosen] = -1.0
                i = int(np.argmax(gap))
            chosen.append(i)
            nearest = np.minimum(nearest, ((x - x[i]) ** 2).sum(axis=1))
        return [pool[i] for i in chosen]

    def tell(self, results):
        results = list(results)
        super().tell(results)
        if results:
            self.model.add_results(results, self._feats, group=self.task_key)


class SeedsFirst(Strategy):
    """The given seeds in order (those among the candidates), then `then`'s picks: the shipped
    search's order (search_unit runs a unit's expert seeds before the model-based search)."""

    name = "seeds-first"

    def __init__(self, seeds: Sequence[Config], then: Strategy, candidates=None, features=None, task_key: str = ""):
        self.seeds = list(seeds)
        self.then = then
        super().__init__(candidates, features, task_key)

    def bind(self, candidates, features=None, task_key=None):
        super().bind(candidates, features, task_key)
        self.then.bind(self.candidates, features, task_key)
        return self

    def _pick(self, pool, n):
        members = set(pool)
        picks = [c for c in self.seeds if c in members][:n]
        if len(picks) < n:
            self.then._asked.update(self._asked | set(picks))
            picks += self.then.ask(n - len(picks))
        return picks

    def tell(self, results):
        results = list(results)
        super().tell(results)
        self.then.tell(results)


def choose_strategy(n_configs: int, budget: Optional[int], cost_model: Optional[CostModel] = None,
                    seed: int = 0, small_space: int = 16, sms: Optional[int] = None) -> Strategy:
    """Exhaustive when the whole space fits the trial budget (or is tiny when only a time
    budget is given); otherwise model-based search (its prior given the device's `sms`)."""
    if (budget is not None and n_configs <= budget) or (budget is None and n_configs <= small_space):
        return Exhaustive()
    return ModelBased(cost_model, seed=seed, sms=sms)
