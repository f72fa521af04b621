"""Kernel-by-kernel GPU time of one callable, from torch.profiler's CUDA activity.

Used to compare what kernelwright launches with what eager PyTorch and torch.compile launch for
the same problem: which kernels run, how often per call, and how long each takes. Each call is
preceded by an L2 flush, as in the timing protocol; the flush's kernels are subtracted.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from kernelwright.measure.l2 import L2Flusher
from kernelwright.measure.timer import require_gpu

__all__ = ["KernelTime", "kernel_times", "format_kernel_table"]

@dataclass(frozen=True)
class KernelTime:
    name: str
    us_per_call: float  # summed device time of this kernel per call of the profiled callable
    launches_per_call: float


def _short(name: str, width: int = 90) -> str:
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 3] + "..."


def _device_kernels(prof) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            t = out.setdefault(ev.name, [0.0, 0])
            t[0] += ev.device_time
            t[1] += 1
    return out


def _profile(body: Callable[[], None], dev) -> dict[str, list[float]]:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes on event cycles
        with torch.profiler.profile(activities=acts) as prof:
            body()
            torch.cuda.synchronize(dev)
    return _device_kernels(prof)


def kernel_times(fn: Callable[[], object], calls: int = 10, warmup: int = 3, device="cuda") -> list[KernelTime]:
    """Profile `calls` calls of `fn` (after `warmup` unprofiled ones), each after an L2 flush;
    returns kernels sorted by device time per call, longest first. The flush's own kernels are
    found by profiling the flush alone and subtracted (launches and their mean time)."""
    dev = require_gpu(device)
    if calls < 1:
        raise ValueError("calls must be >= 1")
    flusher = L2Flusher(dev)
    for _ in range(warmup):
        flusher.flush()
        fn()
    torch.cuda.synchronize(dev)
    flush_only = _profile(lambda: [flusher.flush() for _ in range(calls)], dev)

    def body():
        for _ in range(calls):
            flusher.flush()
            fn()

    total = _profile(body, dev)
    for name, (t, n) in flush_only.items():
        if name in total:
            total[name][0] -= t
            total[name][1] -= n
    out = [KernelTime(_short(k), max(v[0], 0.0) / calls, v[1] / calls) for k, v in total.items() if v[1] > 0]
    return sorted(out, key=lambda k: -k.us_per_call)


def format_kernel_table(label: str, rows: list[KernelTime]) -> str:
    """A plain-text block: one line per kernel, then the total per call."""
    lines = [f"== {label}: {sum(r.us_per_call for r in rows):.1f} us of kernels per call"]
    for r in rows:
        lines.append(f"  {r.us_per_call:10.1f} us  x{r.launches_per_call:<4g} {r.name}")
    return "\n".join(lines)
