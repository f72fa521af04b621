"""Schedule spaces generated from a few axes and constraints (not hand-listed rows).

    Space("pointwise",
          [Axis("BLOCK", pow2_range(128, 4096)), Axis("num_warps", [2, 4, 8]),
           Axis("num_stages", [1, 2])],
          [lambda c: c["BLOCK"] // (32 * c["num_warps"]) >= 1])

``space.configs()`` is the product of the axes in axis order (the last axis varies
fastest), filtered by every constraint, with duplicates dropped: a deterministic list.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from .config import Config, Value

Constraint = Callable[[dict], bool]


def next_pow2(n: int) -> int:
    """The smallest power of two at least n (1 for n <= 1): the block that covers n elements."""
    return 1 << max(0, int(n) - 1).bit_length()


def tiles(spec: str) -> list[tuple[int, int, int, int, int]]:
    """Tile configs written as "BMxBNxBK/warps/stages" words, space-separated:
    ``tiles("128x256x64/8/3 64x128x32/4/4")`` -> [(128, 256, 64, 8, 3), (64, 128, 32, 4, 4)]."""
    out = []
    for word in spec.split():
        shape, warps, stages = word.split("/")
        bm, bn, bk = (int(v) for v in shape.split("x"))
        out.append((bm, bn, bk, int(warps), int(stages)))
    return out


def pow2_range(lo: int, hi: int) -> list[int]:
    """Powers of two p with lo <= p <= hi, ascending (``pow2_range(128, 1024)`` -> 128..1024)."""
    if lo < 1 or hi < lo:
        raise ValueError(f"pow2_range needs 1 <= lo <= hi, got ({lo}, {hi})")
    p = 1
    while p < lo:
        p *= 2
    out = []
    while p <= hi:
        out.append(p)
        p *= 2
    return out


def parse_selection(text: str) -> dict[str, set[str]]:
    """A selection of configs written as ``AXIS=V[:V...],...`` (``WAVE=1,BLOCK_H=16:32``) as
    {axis: {values as text}}; true / false axes take 1 / 0. ValueError on a malformed part."""
    out: dict[str, set[str]] = {}
    for part in text.split(","):
        key, sep, vals = part.partition("=")
        if not sep or not key.strip() or not vals:
            raise ValueError(f"a selection is AXIS=V[:V...] separated by commas, got {part!r}")
        out[key.strip()] = set(vals.split(":"))
    return out


def selected(config: Mapping[str, Any], selection: Mapping[str, set[str]]) -> bool:
    """Whether `config` takes one of the listed values on every axis of `selection`
    (`parse_selection`'s form); an axis the config lacks reads as false (0)."""
    def text(v) -> str:
        return str(int(v)) if isinstance(v, bool) else str(v)
    return all(text(config.get(k, False)) in vs for k, vs in selection.items())


@dataclass(frozen=True)
class Axis:
    """One parameter of a space and the values it may take (order kept, repeats dropped)."""

    name: str
    values: tuple[Value, ...]

    def __init__(self, name: str, values: Iterable[Value]):
        vals: list = []
        for v in values:
            if v not in vals or any(type(v) is not type(u) for u in vals if u == v):
                vals.append(v)
        if not vals:
            raise ValueError(f"axis {name!r} has no values")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "values", tuple(vals))

    def __len__(self) -> int:
        return len(self.values)


def _make_rng(rng: Any) -> random.Random:
    if rng is None or isinstance(rng, int):
        return random.Random(rng)
    if isinstance(rng, random.Random):
        return rng
    if hasattr(rng, "integers"):  # numpy Generator
        return random.Random(int(rng.integers(0, 2**63 - 1)))
    raise TypeError(f"rng must be None, an int seed, random.Random or numpy Generator, got {rng!r}")


@dataclass
class Space:
    """The schedule space of one template: product of axes, filtered by constraints.

    ``fixed`` parameters are added to every config unchanged (e.g. a dtype flag); they are
    visible to the constraints.
    """

    template: str
    axes: list[Axis]
    constraints: list[Constraint] = field(default_factory=list)
    fixed: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.axes = list(self.axes)
        self.constraints = list(self.constraints)
        self.fixed = dict(self.fixed)
        names = [a.name for a in self.axes] + list(self.fixed)
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"space {self.template!r}: parameter(s) {sorted(dup)} given twice")
        self._configs: tuple[Config, ...] | None = None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.axes]

    @property
    def product_size(self) -> int:
        """Size of the unfiltered product of the axes."""
        n = 1
        for a in self.axes:
            n *= len(a)
        return n

    def _admits(self, params: dict) -> bool:
        return all(bool(c(params)) for c in self.constraints)

    def configs(self) -> list[Config]:
        if self._configs is None:
            seen: set[Config] = set()
            out: list[Config] = []
            for values in itertools.product(*(a.values for a in self.axes)):
                params = dict(zip(self.names, values))
                params.update(self.fixed)
                if not self._admits(params):
                    continue
                cfg = Config(self.template, tuple(params.items()))
                if cfg not in seen:
                    seen.add(cfg)
                    out.append(cfg)
            self._configs = tuple(out)
        return list(self._configs)

    def sample(self, n: int, rng: Any = None) -> list[Config]:
        """Up to ``n`` distinct configs drawn uniformly without replacement."""
        cfgs = self.configs()
        if n >= len(cfgs):
            n = len(cfgs)
        return _make_rng(rng).sample(cfgs, n)

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Config) and config in set(self.configs())

    def __len__(self) -> int:
        return len(self.configs())

    def __iter__(self) -> Iterator[Config]:
        return iter(self.configs())


def union(*spaces: "Space | Sequence[Config]") -> list[Config]:
    """All configs of several spaces (or config lists) in order, duplicates dropped."""
    seen: set[Config] = set()
    out: list[Config] = []
    for sp in spaces:
        for cfg in (sp.configs() if isinstance(sp, Space) else sp):
            if cfg not in seen:
                seen.add(cfg)
                out.append(cfg)
    return out
