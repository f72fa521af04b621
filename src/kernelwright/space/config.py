"""A schedule as a small frozen record: ``Config(template, params)``.

A Config names the template it fills and the values of its parameters. Parameters are
kept sorted by name, so two configs with the same values are equal, hash alike and have
the same ``key()`` whatever order they were given in.
"""
from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Union

Value = Union[int, str, bool, float]

# characters that would make key() ambiguous
_RESERVED = ",=[]"


def _normalise_value(name: str, value: Any) -> Value:
    """Plain Python scalars only (numpy scalars become int/float/bool)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if any(ch in value for ch in _RESERVED):
            raise ValueError(f"config parameter {name!r}: value {value!r} contains one of {_RESERVED!r}")
        return value
    # numpy bool_ is not a numbers.Number subclass but has .item()
    if type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"config parameter {name!r}: value {value!r} is not int, float, bool or str")


def _format_value(value: Value) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _parse_value(text: str) -> Value:
    if text == "True":
        return True
    if text == "False":
        return False
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class Config:
    """A frozen, hashable kernel schedule: template name plus sorted (name, value) pairs."""

    template: str
    params: tuple[tuple[str, Value], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.template, str) or not self.template:
            raise ValueError(f"Config.template must be a non-empty string, got {self.template!r}")
        items = self.params.items() if isinstance(self.params, Mapping) else self.params
        norm: dict[str, Value] = {}
        for pair in items:
            name, value = pair
            if not isinstance(name, str) or not name or any(ch in name for ch in _RESERVED):
                raise ValueError(f"config parameter names must be non-empty strings without "
                                 f"{_RESERVED!r}, got {name!r}")
            if name in norm:
                raise ValueError(f"config parameter {name!r} given twice")
            norm[name] = _normalise_value(name, value)
        object.__setattr__(self, "params", tuple(sorted(norm.items())))

    # construction -------------------------------------------------------------------
    @classmethod
    def make(cls, template: str, /, **params: Value) -> "Config":
        return cls(template, tuple(params.items()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Config":
        if "template" not in data:
            raise ValueError(f"config record without 'template': {data!r}")
        return cls(data["template"], tuple(dict(data.get("params", {})).items()))

    @classmethod
    def from_json(cls, data: "str | Mapping[str, Any]") -> "Config":
        """Inverse of ``to_json`` (also accepts the dict of ``to_dict``)."""
        return cls.from_dict(json.loads(data) if isinstance(data, str) else data)

    @classmethod
    def from_key(cls, key: str) -> "Config":
        """Inverse of ``key()`` (values are read back as bool, int, float or str)."""
        if not key.endswith("]") or "[" not in key:
            raise ValueError(f"not a config key: {key!r}")
        template, _, body = key[:-1].partition("[")
        params = []
        if body:
            for item in body.split(","):
                name, eq, text = item.partition("=")
                if not eq:
                    raise ValueError(f"not a config key: {key!r}")
                params.append((name, _parse_value(text)))
        return cls(template, tuple(params))

    # access -------------------------------------------------------------------------
    def get(self, name: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        return default

    def __getitem__(self, name: str) -> Value:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"{name!r} is not a parameter of {self.key()}")

    def __contains__(self, name: object) -> bool:
        return any(k == name for k, _ in self.params)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.params)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.params)

    def as_dict(self) -> dict[str, Value]:
        return dict(self.params)

    def replace(self, **params: Value) -> "Config":
        """A copy with some parameters changed or added."""
        merged = dict(self.params)
        merged.update(params)
        return Config(self.template, tuple(merged.items()))

    # serialisation ------------------------------------------------------------------
    def key(self) -> str:
        """Stable string, e.g. ``rowwise[BLOCK_N=1024,num_warps=4]``; usable as a cache key."""
        body = ",".join(f"{k}={_format_value(v)}" for k, v in self.params)
        return f"{self.template}[{body}]"

    def to_dict(self) -> dict[str, Any]:
        return {"template": self.template, "params": dict(self.params)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __str__(self) -> str:
        return self.key()

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params)
        return f"Config.make({self.template!r}{args})"
