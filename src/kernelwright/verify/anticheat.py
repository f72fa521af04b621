"""Anti-cheat checks of docs/design.md's verification protocol, one small named function per rule.

Each check returns None when the candidate passes it, or a one-line reason. `verify` runs them
all; `CHECKS` names them in the order of docs/design.md's list.

The originals of the timers a cheat could patch are captured when this module is imported (it is
imported with `kernelwright.verify`), before any candidate is built.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

from dataclasses import dataclass

import torch

__all__ = [
    "CHECKS",
    "ORIGINAL_TIMERS",
    "check_constant_outputs",
    "check_output_memory",
    "check_other_streams",
    "check_input_mutation",
    "check_lazy_results",
    "check_deferred_values",
    "check_patched_timers",
    "check_reference_fallback",
    "reference_disabled",
    "same_values",
]

CHECKS = (
    "constant_outputs",   # (1) outputs that do not change when inputs change
    "output_memory",      # (2) reuse of the reference's output memory (or of input memory)
    "other_streams",      # (3) work left running on other streams
    "input_mutation",     # (4) mutation of inputs
    "lazy_results",       # (5) lazy or deferred results
    "patched_timers",     # (6) patched timers
    "reference_fallback", # (7) try/except fallbacks to the reference
)

# (owner, attribute) of every timer a cheat could patch; captured at import.
_TIMER_SITES: dict[str, tuple[Any, str]] = {
    "time.perf_counter": (time, "perf_counter"),
    "time.perf_counter_ns": (time, "perf_counter_ns"),
    "time.time": (time, "time"),
    "time.monotonic": (time, "monotonic"),
    "torch.cuda.synchronize": (torch.cuda, "synchronize"),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
    "torch.cuda.Event.record": (torch.cuda.Event, "record"),
    "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
    "torch.cuda.Stream.synchronize": (torch.cuda.Stream, "synchronize"),
}
ORIGINAL_TIMERS: dict[str, Any] = {name: getattr(owner, attr) for name, (owner, attr) in _TIMER_SITES.items()}
synchronize = ORIGINAL_TIMERS["torch.cuda.synchronize"]  # the verifier's own, unpatchable copy


# outputs up to this many elements are copied for the checks; larger ones are fingerprinted
# (float64 sum, NaN count, a strided sample), so that verifying a gigabyte output keeps no copies
SNAPSHOT_LIMIT = 1 << 26
_SAMPLE = 1 << 16


@dataclass
class Fingerprint:
    """What `snapshot` keeps of a large tensor: enough to tell two versions of its values apart."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    total: torch.Tensor  # sum of the non-NaN elements, in float64 (complex128 for complex)
    nans: torch.Tensor  # how many elements are NaN
    sample: torch.Tensor  # every k-th element, about _SAMPLE of them


_PIECE = 1 << 24  # elements a fingerprint reads at a time (its temporaries stay small)


def fingerprint(t: torch.Tensor) -> Fingerprint:
    t = t.detach().as_subclass(torch.Tensor)
    flat = t.reshape(-1)
    sample = flat[:: max(1, flat.numel() // _SAMPLE)].clone()
    floating = t.dtype.is_floating_point or t.dtype.is_complex
    wide = torch.complex128 if t.dtype.is_complex else torch.float64 if floating else torch.int64
    total = torch.zeros((), dtype=wide, device=t.device)
    nans = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, flat.numel(), _PIECE):
        piece = flat[start:start + _PIECE]
        if floating:
            total += torch.nansum(piece.to(wide))
            nans += torch.isnan(piece).sum()
        else:
            total += torch.sum(piece, dtype=torch.int64)
    return Fingerprint(t.shape, t.dtype, t.device, total, nans, sample)


def snapshot(t: torch.Tensor):
    """A copy of `t`'s values now (a Fingerprint when it has more than SNAPSHOT_LIMIT elements),
    made on the current stream; `same_values` compares snapshots and tensors alike."""
    t = t.detach().as_subclass(torch.Tensor)
    return t.clone() if t.numel() <= SNAPSHOT_LIMIT else fingerprint(t)


def same_values(a, b) -> bool:
    """Bitwise-style equality: same shape and dtype, equal elements, NaN equal to NaN. Either
    side may be a Fingerprint (then the fingerprints are compared)."""
    if isinstance(a, Fingerprint) or isinstance(b, Fingerprint):
        fa = a if isinstance(a, Fingerprint) else fingerprint(a)
        fb = b if isinstance(b, Fingerprint) else fingerprint(b)
        return (fa.shape == fb.shape and fa.dtype == fb.dtype and fa.device == fb.device
                and bool(torch.equal(fa.total, fb.total) or (torch.isnan(fa.total) & torch.isnan(fb.total)).item())
                and bool(torch.equal(fa.nans, fb.nans)) and same_values(fa.sample, fb.sample))
    a = a.detach().as_subclass(torch.Tensor)
    b = b.detach().as_subclass(torch.Tensor)
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


def _span(t: torch.Tensor) -> tuple[Any, int, int]:
    """(device, first byte, one past the last byte) of the storage behind `t`."""
    st = t.untyped_storage()
    start = st.data_ptr()
    return t.device, start, start + st.nbytes()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    da, a0, a1 = _span(a)
    db, b0, b1 = _span(b)
    if da != db:
        return False
    if a1 == a0 or b1 == b0:  # empty storages
        return a0 == b0 and a0 != 0
    return a0 < b1 and b0 < a1


# (1) ---------------------------------------------------------------------------------------
def check_constant_outputs(
    ref_a: Sequence[torch.Tensor], ref_b: Sequence[torch.Tensor],
    cand_a: Sequence[torch.Tensor], cand_b: Sequence[torch.Tensor], skip: set[int] | frozenset = frozenset(),
) -> str | None:
    """Two different input sets: where the reference's output i differs by more than rounding, the
    candidate's must differ too (but for the outputs in `skip`). A change of a few units in the
    last place of the output's dtype is no change: a bf16 output of a few values in a narrow range
    (a log-sum-exp over 16 sigmoids lies within 2 ulps) rounds to the same values for both sets in
    a more accurate candidate while the reference's rounding noise moves it by one."""
    for i, (ra, rb, ca, cb) in enumerate(zip(ref_a, ref_b, cand_a, cand_b)):
        if i not in skip and _changed(ra, rb) and same_values(ca, cb):
            return f"constant output: output {i} did not change when the inputs changed (the reference's did)"
    return None


ROUNDING_ULPS = 4  # a change of at most this many units in the last place could be rounding alone


def _changed(a, b) -> bool:
    """Whether the reference's output moved between two input sets by more than rounding: beyond
    ROUNDING_ULPS units in the last place of a float dtype somewhere (fingerprints of large outputs,
    and other dtypes, by any change)."""
    if isinstance(a, Fingerprint) or isinstance(b, Fingerprint):
        return not same_values(a, b)
    a = a.detach().as_subclass(torch.Tensor)
    b = b.detach().as_subclass(torch.Tensor)
    if a.shape != b.shape or a.dtype != b.dtype or not a.dtype.is_floating_point:
        return not same_values(a, b)
    a64, b64 = a.double(), b.double()
    both = torch.isfinite(a64) & torch.isfinite(b64)
    if not torch.equal(torch.isfinite(a64), torch.isfinite(b64)) or \
            not torch.equal(a64[~both].nan_to_num(), b64[~both].nan_to_num()):
        return True  # (a value turned infinite or NaN, or an infinity changed sign)
    eps = torch.finfo(a.dtype).eps
    return bool(((a64 - b64).abs() > ROUNDING_ULPS * eps * torch.maximum(a64.abs(), b64.abs()))[both].any())


# (2) ---------------------------------------------------------------------------------------
def check_output_memory(
    cand_outs: Sequence[torch.Tensor], ref_outs: Sequence[torch.Tensor],
    cand_inputs: Sequence[Any], ref_out_aliases_input: Sequence[bool],
) -> str | None:
    """Candidate outputs must not live in the reference's output memory, nor in the memory of an
    input unless the reference's output i aliases an input too (a view-returning model)."""
    for i, out in enumerate(cand_outs):
        for j, r in enumerate(ref_outs):
            if _overlaps(out, r):
                return f"reuses the reference's output memory: output {i} overlaps the reference's output {j}"
        aliased_ok = i < len(ref_out_aliases_input) and ref_out_aliases_input[i]
        if not aliased_ok:
            for j, x in enumerate(cand_inputs):
                if isinstance(x, torch.Tensor) and _overlaps(out, x):
                    return f"returns input memory: output {i} overlaps input {j}, which the reference's output does not"
    return None


def aliases_any(out: torch.Tensor, inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and _overlaps(out, x) for x in inputs)


# (3) ---------------------------------------------------------------------------------------
def check_other_streams(
    early: Sequence[torch.Tensor] | None, settled: Sequence[torch.Tensor], device: torch.device,
    stream_before: Any = None, stream_after: Any = None,
) -> str | None:
    """`early`: copies of the outputs made on the current stream right after the call returned,
    without synchronizing; `settled`: copies made after a device-wide synchronize. They differ
    when the outputs were still being written on another stream. No-op on CPU (returns None;
    `verify` records it as skipped)."""
    if device.type != "cuda" or early is None:
        return None
    if stream_before is not None and stream_after is not None and stream_before != stream_after:
        return "work on other streams: the call changed the current CUDA stream and did not restore it"
    for i, (e, s) in enumerate(zip(early, settled)):
        if not same_values(e, s):
            return (f"work on other streams: output {i} was not complete on the current stream "
                    "when the call returned")
    return None


# (4) ---------------------------------------------------------------------------------------
def check_input_mutation(
    inputs_after: Sequence[Any], inputs_before: Sequence[Any], reference_mutates: bool = False
) -> str | None:
    """Inputs must be bitwise unchanged by the call (unless the reference itself mutates them)."""
    if reference_mutates:
        return None
    for j, (a, b) in enumerate(zip(inputs_after, inputs_before)):
        if isinstance(a, torch.Tensor) and not same_values(a, b):
            return f"mutates its inputs: input {j} changed during the call"
    return None


# (5) ---------------------------------------------------------------------------------------
def check_lazy_results(outs: Sequence[Any]) -> str | None:
    """Every output must be a plain torch.Tensor (no subclass that could compute on access)."""
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            return f"lazy result: output {i} is a {type(o).__module__}.{type(o).__qualname__}, not a plain torch.Tensor"
    return None


def check_deferred_values(settled: Sequence[torch.Tensor], later: Sequence[torch.Tensor]) -> str | None:
    """Values read after a full synchronize must not change when read again after a delay."""
    for i, (s, l) in enumerate(zip(settled, later)):
        if not same_values(s, l):
            return f"deferred result: output {i} changed after the call returned and the device was synchronized"
    return None


# (6) ---------------------------------------------------------------------------------------
def check_patched_timers(restore: bool = True) -> str | None:
    """The timers must be the originals captured at import; patched ones are restored."""
    patched = [name for name, (owner, attr) in _TIMER_SITES.items()
               if getattr(owner, attr, None) is not ORIGINAL_TIMERS[name]]
    if not patched:
        return None
    if restore:
        for name in patched:
            owner, attr = _TIMER_SITES[name]
            setattr(owner, attr, ORIGINAL_TIMERS[name])
    return "patched timers: " + ", ".join(patched)


# (7) ---------------------------------------------------------------------------------------
class ReferenceCalled(RuntimeError):
    """Raised by the reference's forward while a candidate runs."""


class _Tripwire:
    def __init__(self):
        self.called = False


@contextlib.contextmanager
def reference_disabled(reference: torch.nn.Module):
    """Replace the reference model's forward with one that raises (and records the call).

    The instance's forward is replaced; so is its class's, unless the class is one of torch's own
    (patching e.g. nn.Linear.forward would break honest candidates built from nn.Linear).
    Yields a tripwire whose `.called` says whether the candidate tried to call the reference.
    """
    wire = _Tripwire()

    def _raiser(*args, **kwargs):
        wire.called = True
        raise ReferenceCalled("the reference model's forward was called by the candidate")

    cls = type(reference)
    patch_class = not cls.__module__.startswith("torch.")
    had_instance = "forward" in reference.__dict__
    saved_instance = reference.__dict__.get("forward")
    saved_class = cls.__dict__.get("forward") if patch_class else None
    object.__setattr__(reference, "forward", _raiser)
    if patch_class:
        cls.forward = lambda self, *a, **k: _raiser(*a, **k)
    try:
        yield wire
    finally:
        if had_instance:
            object.__setattr__(reference, "forward", saved_instance)
        else:
            reference.__dict__.pop("forward", None)
        if patch_class:
            if saved_class is not None:
                cls.forward = saved_class
            else:
                try:
                    del cls.forward
                except AttributeError:
                    pass


def check_reference_fallback(wire: _Tripwire) -> str | None:
    if wire.called:
        return "falls back to the reference: the candidate called the reference model's forward"
    return None
