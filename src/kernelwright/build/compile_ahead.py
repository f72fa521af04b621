"""Compiling a batch of candidates' Triton kernels side by side before their first runs.

Triton compiles a kernel at its first launch, so a tuner that checks candidates one after another
compiles them one after another too (front end, MLIR passes, LLVM, ptxas: most of a candidate's
first run). `compile_ahead` calls each candidate's launcher once with every Triton launch turned
into a `warmup` call (`fn[grid](...)` and the modules' `_launch` helper alike) under
`triton.AsyncCompileMode`, which compiles them in a thread pool (the passes and ptxas run without
the GIL); the compiled kernels land in each kernel's own cache, where the candidate's real first
launch finds them. No generated kernel runs: only the launchers' torch work (allocations, layout
copies) reaches the device, on values nobody reads. For launchers of Triton kernels only (a CUDA
C++ module's kernels would run).

Best effort: a launcher that raises, a kernel that fails to compile, or a compile still running
after `limit_s` is left to the candidate's real first run, which compiles it again and reports
or times out as without this pass (measure/watchdog.py attributes a hang to its candidate).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Sequence

from kernelwright.errors import UserError

MAX_WORKERS = 8  # compile threads (each compile also holds an MLIR context and a ptxas process)
ENV = "KERNELWRIGHT_COMPILE_WORKERS"  # compile threads; 0 or 1 turns the pass off


def workers_from_env(n_calls: int) -> int:
    """Compile threads for `n_calls` launchers: $KERNELWRIGHT_COMPILE_WORKERS when set (a bad value
    is a one-line error), else up to MAX_WORKERS and the CPU count."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return max(1, min(n_calls, os.cpu_count() or 1, MAX_WORKERS))
    if not raw.isdigit():
        raise UserError(f"{ENV}={raw!r}: expected a whole number of compile threads (0 or 1: off)")
    return min(int(raw), n_calls)


def _warmup(kernel, grid, *args, **meta):
    """The generated modules' `_launch(kernel, grid, *args, **meta)`, compiling instead of running."""
    kernel.warmup(*args, grid=grid, **meta)


def _compiling(self, grid):
    """`fn[grid]` of a Triton kernel, compiling instead of running."""
    return lambda *args, **kwargs: self.warmup(*args, grid=grid, **kwargs)


def compile_ahead(calls: Sequence[tuple[object, list]], limit_s: float | None = None,
                  workers: int | None = None) -> int:
    """Compile the Triton kernels that `module.launch(*args)` would launch, for every (module,
    args) in `calls`, in parallel; returns how many compiles finished (0 where Triton has no
    AsyncCompileMode, or with fewer than two calls). During the calls `KernelInterface.__getitem__`
    (what `fn[grid]` runs) and each module's `_launch` (codegen/host.py, whose fast path calls a
    compiled kernel directly) compile instead of launching."""
    import triton

    mode_cls = getattr(triton, "AsyncCompileMode", None)
    workers = workers if workers is not None else workers_from_env(len(calls))
    if mode_cls is None or len(calls) < 2 or workers < 2:
        return 0
    from triton.runtime import _async_compile
    from triton.runtime.jit import KernelInterface

    pool = ThreadPoolExecutor(workers, thread_name_prefix="kw-compile")
    mode = mode_cls(pool, ignore_errors=True)
    late: set = set()
    launch = KernelInterface.__getitem__
    try:
        mode.__enter__()
        KernelInterface.__getitem__ = _compiling  # type: ignore[method-assign]
        for module, args in calls:
            real = getattr(module, "_launch", None)
            if real is not None:
                module._launch = _warmup
            try:
                module.launch(*args)
            except Exception:  # noqa: BLE001 - the real first run reports it
                pass
            finally:
                if real is not None:
                    module._launch = real
        KernelInterface.__getitem__ = launch  # type: ignore[method-assign]
        futures = list(getattr(mode, "raw_futures", []))
        done, late = wait(futures, timeout=limit_s)
        if not late:
            mode.__exit__(None, None, None)  # hands every compiled kernel to its kernel's cache
            return len(done)
        for f in done:  # the finished ones only: the late ones compile again at their first run
            key = getattr(f, "_key", None)
            if key in mode.future_kernels:
                mode.future_kernels[key].result(ignore_errors=True)
        return len(done)
    finally:
        KernelInterface.__getitem__ = launch  # type: ignore[method-assign]
        if _async_compile.active_mode.get() is mode:
            _async_compile.active_mode.set(None)
        pool.shutdown(wait=not late, cancel_futures=True)
