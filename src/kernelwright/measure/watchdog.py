"""A guard against candidates that never finish on the GPU, or that fault it.

A kernel that deadlocks blocks the process in its next synchronisation, where no Python exception
can reach it (on the H200 a bench never returned from a GEMM search whose first candidate was a
warp-specialized persistent kernel; docs/benchmarks.md, "Design choices": the hang guard). `guard` arms a timer
around a candidate's first run (its JIT compile and verification); when the timer fires, the
candidate is recorded as failed (error kind "hang", which the search never retries) and the
process exits with one line on stderr: the CUDA context cannot be recovered in-process, and a
rerun continues without that candidate. A candidate whose first run faults the GPU (an illegal
instruction or memory access: the CUDA context is lost for the whole process; seen on the H200 with
a tensor-descriptor box of NCHW memory) is handled alike, as error kind "fault" (`is_device_fault`; it
ends the process through `hang_exit` too).
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from kernelwright.errors import UserError

HANG = "hang"
FAULT = "fault"
NEVER_AGAIN = (HANG, FAULT)  # error kinds a search does not retry on the device that recorded them
HANG_EXIT_CODE = 75  # EX_TEMPFAIL: run the same command again
# what CUDA says when a kernel has lost the process's context (every later call fails too)
_FAULTS = ("illegal instruction", "illegal memory access", "unspecified launch failure", "misaligned address",
           "device-side assert", "an illegal address")
DEFAULT_SECONDS = 240.0


def limit_seconds() -> float:
    """Seconds a candidate's first run may take: $KERNELWRIGHT_HANG_S, else DEFAULT_SECONDS
    (0 turns the guard off)."""
    text = os.environ.get("KERNELWRIGHT_HANG_S", "").strip()
    if not text:
        return DEFAULT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UserError(f"KERNELWRIGHT_HANG_S={text!r}: expected a number of seconds >= 0")
    return value


def hang_exit(message: str, record: Optional[Callable[[str], None]] = None) -> None:
    """Record the hang or fault (best effort), say so on stderr and end the process at once."""
    try:
        if record is not None:
            record(message)
    finally:
        sys.stderr.write(f"kernelwright: error: {message}; recorded as failed, run the command again "
                         "to continue without it\n")
        sys.stderr.flush()
        os._exit(HANG_EXIT_CODE)


def is_device_fault(error: BaseException) -> bool:
    """Whether `error` is CUDA reporting a lost context (a kernel faulted the GPU)."""
    text = str(error)
    return "CUDA error" in text and any(f in text for f in _FAULTS)


@contextmanager
def guard(seconds: Optional[float], on_hang: Callable[[], None]) -> Iterator[None]:
    """Run the block; if it has not finished after `seconds`, call `on_hang` from a timer thread
    (which normally ends the process, see `hang_exit`). None or <= 0 seconds: no guard."""
    if not seconds or seconds <= 0:
        yield
        return
    timer = threading.Timer(seconds, on_hang)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
