"""Interleaved timing with CUDA events (docs/design.md, "Timing protocol").

Each implementation is warmed up by time (its first call, which compiles and autotunes, is not
counted), then all are timed in interleaved rounds whose order changes each round (a Williams design:
every implementation equally often in every position and right after every other), with an L2
flush before each timed run (outside the event pair) and one event pair around each call, on the
current stream; the host time each call takes to issue (no synchronisation) is kept beside it, so
a CPU-bound implementation shows as one whose issue time nears its median. Without a GPU nothing
is timed: `RuntimeError("timing needs a CUDA GPU")`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch

from kernelwright.measure.l2 import NO_GPU, L2Flusher, _cuda_device

__all__ = ["Timing", "time_interleaved", "round_order", "runs_for_budget", "require_gpu", "NO_GPU"]


@dataclass
class Timing:
    median_ms: float
    mean_ms: float
    min_ms: float
    std_ms: float
    runs: int
    issue_ms: float | None = None  # median host time to issue one call (no sync): near median_ms = CPU-bound

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], issue_ms: Sequence[float] = ()) -> "Timing":
        xs = [float(x) for x in samples_ms]
        if not xs:
            raise ValueError("no samples")
        return cls(
            median_ms=statistics.median(xs),
            mean_ms=statistics.fmean(xs),
            min_ms=min(xs),
            std_ms=statistics.stdev(xs) if len(xs) > 1 else 0.0,
            runs=len(xs),
            issue_ms=statistics.median(issue_ms) if issue_ms else None,
        )

    def to_json(self) -> dict:
        return asdict(self)


def require_gpu(device=None) -> torch.device:
    """The CUDA device to time on; RuntimeError("timing needs a CUDA GPU") without one."""
    return _cuda_device(device)


def round_order(names: Sequence[str], r: int) -> list[str]:
    """Order of round `r`, from a Williams design: over a cycle of n rounds (2n for an odd
    number n of names) every implementation runs equally often in every position and right after
    every other one. (Rotating one order, A B C, B C A, C A B, balances positions but always runs
    B right after A: whatever A leaves behind, a hot or throttled GPU say, would always land on B.)"""
    names = list(names)
    n = len(names)
    if n < 2:
        return names
    first, lo, hi = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...
    while lo <= hi:
        first.append(lo)
        lo += 1
        if lo <= hi:
            first.append(hi)
            hi -= 1
    cycle = n if n % 2 == 0 else 2 * n
    k = r % cycle
    row = [names[(i + k) % n] for i in first]
    return row[::-1] if k >= n else row


def runs_for_budget(per_round_s: float, min_runs: int, max_runs: int, budget_s: float | None) -> int:
    """Timed rounds: min_runs without a budget, else as many as fit in budget_s, within bounds."""
    if budget_s is None or per_round_s <= 0:
        return min_runs
    return int(min(max_runs, max(min_runs, math.floor(budget_s / per_round_s))))


def _warm_up(fn: Callable[[], Any], warmup_s: float, device: torch.device) -> tuple[float, float]:
    """First call (compilation, autotuning, allocation) untimed, then calls for >= warmup_s.
    Returns the mean seconds per call during the timed part of the warm-up and the longest host
    time one of those calls took to issue (seconds, no synchronisation)."""
    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    n, issue = 0, 0.0
    while True:
        t1 = time.perf_counter()
        fn()
        issue = max(issue, time.perf_counter() - t1)
        torch.cuda.synchronize(device)
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= warmup_s:
            return elapsed / n, issue


_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of torch.cuda._sleep (a spinning kernel) per millisecond on `device`, measured once."""
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SLEEP_CYCLES_PER_MS:
        with torch.cuda.device(device):
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            torch.cuda.synchronize(device)
            _SLEEP_CYCLES_PER_MS[key] = 2_000_000 / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES_PER_MS[key]


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    warmup_s: float = 0.2,
    min_runs: int = 50,
    max_runs: int = 1000,
    flush: bool = True,
    budget_s: float | None = None,
    device=None,
    device_only: bool = False,
) -> dict[str, Timing]:
    """Time zero-argument callables in interleaved rounds (round_order); returns name -> Timing.

    `min_runs` timed runs each (at least 50 is the protocol's floor; fewer is allowed for quick
    looks), more up to `max_runs` when `budget_s` (seconds for the timed rounds) allows.
    `device_only`: before each timed call the stream spins (torch.cuda._sleep) for twice the
    longest host issue time seen in the warm-up (at most 1 ms), so the call is queued before its
    start event fires and the events see the GPU's time alone, not the host's launch overhead (a
    kernel of 20 us behind 40 us of Python launch code measures 20 us; the search compares
    candidates so, since the emitted forward may replay as a CUDA graph; whole models are timed
    without it).
    """
    device = require_gpu(device)
    if not fns:
        return {}
    names = list(fns)
    flusher = L2Flusher(device) if flush else None
    warm = {name: _warm_up(fns[name], warmup_s, device) for name in names}
    per_call = {name: per for name, (per, _) in warm.items()}
    lead = {name: 0 for name in names}
    if device_only:
        rate = _sleep_cycles_per_ms(device)
        lead = {name: int(rate * min(2e3 * issue + 0.02, 1.0)) for name, (_, issue) in warm.items()}  # <= 1 ms
    flush_s = 0.0
    if flusher is not None:
        t0 = time.perf_counter()
        for _ in range(3):
            flusher.flush()
        torch.cuda.synchronize(device)
        flush_s = (time.perf_counter() - t0) / 3
    n = runs_for_budget(sum(per_call.values()) + flush_s * len(names), min_runs, max(min_runs, max_runs), budget_s)

    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(n)] for name in names}
    issue = {name: [] for name in names}
    with torch.cuda.device(device):
        for r in range(n):
            for name in round_order(names, r):
                if flusher is not None:
                    flusher.flush()
                if lead[name]:
                    torch.cuda._sleep(lead[name])
                start, end = events[name][r]
                start.record()
                t0 = time.perf_counter()
                fns[name]()
                issue[name].append((time.perf_counter() - t0) * 1e3)
                end.record()
            torch.cuda.synchronize(device)  # keep the host from running far ahead
    return {name: Timing.from_samples([s.elapsed_time(e) for s, e in events[name]], issue[name]) for name in names}


