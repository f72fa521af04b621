"""The outcome of one trial. Failures are data: a result carries an optional time and an
optional error, never an exception."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..space.config import Config

# Conventional error kinds; an error string starts with one of them and a colon,
# e.g. "compile: ptxas out of registers". Anything else is accepted too.
COMPILE = "compile"
WRONG = "wrong"        # ran, but the result did not verify
CRASH = "crash"        # illegal memory access, launch failure, runner exception
TIMEOUT = "timeout"    # compile or run exceeded its time limit
ERROR_KINDS = (COMPILE, WRONG, CRASH, TIMEOUT)


@dataclass
class RunResult:
    """One measured (or failed) candidate.

    time_ms: median time when it ran and verified, else None.
    error:   None on success; otherwise a one-line reason (``"<kind>: message"``).
    excess:  the verification error (excess over allclose), when known.
    extra:   anything else worth keeping (registers, spills, mean time, ...).
    """

    config: Config
    time_ms: Optional[float] = None
    error: Optional[str] = None
    excess: Optional[float] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.time_ms is not None:
            self.time_ms = float(self.time_ms)
        if self.excess is not None:
            self.excess = float(self.excess)
        if self.error is None and self.time_ms is None:
            self.error = f"{CRASH}: no time and no error reported"
        elif self.error is None and not (math.isfinite(self.time_ms) and self.time_ms > 0):
            self.error = f"{CRASH}: invalid time {self.time_ms!r}"

    @property
    def ok(self) -> bool:
        return self.error is None and self.time_ms is not None

    @property
    def error_kind(self) -> Optional[str]:
        """The part of the error before the first colon, or None on success."""
        if self.error is None:
            return None
        head, sep, _ = self.error.partition(":")
        return head.strip() if sep else "error"

    @classmethod
    def success(cls, config: Config, time_ms: float, excess: Optional[float] = None,
                **extra: Any) -> "RunResult":
        return cls(config, time_ms=time_ms, error=None, excess=excess, extra=extra)

    @classmethod
    def failure(cls, config: Config, kind: str, message: str = "",
                excess: Optional[float] = None, **extra: Any) -> "RunResult":
        text = f"{kind}: {message}" if message else kind
        return cls(config, time_ms=None, error=text, excess=excess, extra=extra)

    def __str__(self) -> str:
        if self.ok:
            return f"{self.config.key()}: {self.time_ms:.4g} ms"
        return f"{self.config.key()}: FAILED ({self.error})"
