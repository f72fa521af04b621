"""`verify`: docs/design.md's verification protocol for one candidate.

Per input set k (seed `seed0 + k`, at least max(n_sets, 2) sets):
  1. high-precision reference: a float64 deepcopy of the model on float64 inputs (float32 with
     TF32 off where float64 fails, or is not finite on the first set where eager is;
     `VerifyResult.reference_dtype` says which); a model with a
     `float64_copy()` method (a graph whose casts to bf16 would round the reference) makes its own;
  2. eager: the float32 model under the policy (in bf16 autocast under bf16); its excess over
     the reference sets the floor;
  3. candidate run A on a fresh copy of the inputs, then a decoy run on different inputs, then
     run B on set k again (stale memory from an earlier run then holds other values), each run
     after NaN-poisoning the allocator with blocks the size of the outputs; the reference's
     forward raises while the candidate runs; anti-cheat checks after every run.
Output i passes when its largest candidate excess is at most max(tol, 4 * eager excess_i),
eager excess_i being the largest over the sets; an output must change between the first two
sets where eager's does, unless eager itself misses the reference there by more than
UNREPRODUCIBLE (memory no kernel writes). Any exception the candidate raises, or a failed check,
is a failed result, never an exception out of `verify`.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch.utils import _pytree

from kernelwright.problem.load import _first_line, eager_under, flatten_outputs, output_tree
from kernelwright.verify import anticheat
from kernelwright.verify.compare import REFERENCE_NOT_FINITE, excess_reason, park, poisoned_like

__all__ = ["verify", "VerifyResult", "SetResult"]

_DEFERRED_DELAY_S = 0.05
UNREPRODUCIBLE = 1e6  # eager's excess over the reference past which an output is not checked for constancy


def _jsonable(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclass
class SetResult:
    seed: int
    excess: float  # largest candidate excess over outputs and runs of this set
    eager_excess: float  # largest eager excess over outputs of this set
    passed: bool = False  # every output within its threshold (filled in at the end)
    output_excess: list[float] = field(default_factory=list)  # per output, max over runs
    reasons: list[str] = field(default_factory=list)  # why an output had an infinite excess

    def to_json(self) -> dict:
        d = asdict(self)
        d["excess"], d["eager_excess"] = _jsonable(self.excess), _jsonable(self.eager_excess)
        d["output_excess"] = [_jsonable(x) for x in self.output_excess]
        return d


@dataclass
class VerifyResult:
    passed: bool
    excess: float  # largest candidate excess over sets, outputs and runs
    eager_excess: float  # largest eager excess (same policy) over sets and outputs
    threshold: float  # max(tol, 4 * eager_excess); each output uses its own eager excess
    reason: str | None = None  # one line when not passed
    failed_check: str | None = None  # "build", "exception", "outputs", "excess" or an anticheat.CHECKS name
    policy: str = ""
    tol: float = 0.0
    reference_dtype: str = "float64"  # "float64", or "float32" (TF32 off) where float64 failed
    reference_fallback: str | None = None  # why the float64 reference failed (one line)
    thresholds: list[float] = field(default_factory=list)  # per output
    sets: list[SetResult] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)  # check name -> "ok" | "skipped: ..." | reason

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "excess": _jsonable(self.excess),
            "eager_excess": _jsonable(self.eager_excess),
            "threshold": _jsonable(self.threshold),
            "reason": self.reason,
            "failed_check": self.failed_check,
            "policy": self.policy,
            "tol": self.tol,
            "reference_dtype": self.reference_dtype,
            "reference_fallback": self.reference_fallback,
            "thresholds": [_jsonable(t) for t in self.thresholds],
            "sets": [s.to_json() for s in self.sets],
            "checks": dict(self.checks),
        }


class _Fail(Exception):
    def __init__(self, check: str, reason: str):
        super().__init__(reason)
        self.check, self.reason = check, reason


def _exc_line(e: BaseException) -> str:
    line = _first_line(e)
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        anticheat.synchronize(device)


def _clone_inputs(inputs: list) -> list:
    """Copies of `inputs` with their strides (clone() makes a strided view contiguous, and the
    emitted module is specialised for its inputs' strides)."""
    return [_same_layout_copy(x) if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def _same_layout_copy(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x).requires_grad_(x.requires_grad)


def _upcast(inputs: list, dtype: torch.dtype) -> list:
    return [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


LARGE_INPUTS = 1 << 30  # bytes: input sets above this are drawn again for each use, not kept


class _InputSet:
    """One input set, handed out as fresh copies (every call may change what it is given). A small
    set is kept and cloned; a large one (over LARGE_INPUTS bytes) is drawn again from its seed for
    each use, its fingerprints checked against the first draw's, so that verification holds one
    copy of the inputs at a time."""

    def __init__(self, problem, seed: int, device: torch.device):
        self.problem, self.seed, self.device = problem, seed, device
        first = problem.make_inputs(seed, device)
        large = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor)) > LARGE_INPUTS
        self.kept = None if large else first
        self.prints = _snapshots(first) if large else None

    def fresh(self) -> list:
        if self.kept is not None:
            return _clone_inputs(self.kept)
        inputs = self.problem.make_inputs(self.seed, self.device)
        if not all(anticheat.same_values(x, p) for x, p in zip(inputs, self.prints) if isinstance(x, torch.Tensor)):
            raise RuntimeError(f"{self.problem.where}: get_inputs() drew different values under the same seed")
        return inputs


def _snapshots(inputs: list) -> list:
    """What `inputs` hold now, to tell afterwards whether a call changed them."""
    return [anticheat.snapshot(x) if isinstance(x, torch.Tensor) else x for x in inputs]


@contextlib.contextmanager
def _tf32_off():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


class _HighPrecisionReference:
    """float64 copy of the model; falls back to a float32 copy with TF32 off on first failure."""

    def __init__(self, problem, reference: torch.nn.Module, device: torch.device):
        self.problem, self.device = problem, device
        widened = getattr(reference, "float64_copy", None)  # (a graph with casts of its own: backend.Lifted)
        self.model = widened() if callable(widened) else copy.deepcopy(reference).double()
        self.dtype = "float64"
        self.fallback_reason: str | None = None

    def to_float32(self, reason: str) -> None:
        """The float32 reference (TF32 off) from now on, for `reason`."""
        self.fallback_reason = reason
        self.dtype = "float32"
        self.model = self.problem.make_model(self.device)  # fresh: no hooks a candidate added

    def __call__(self, draw: Callable[[], list]) -> list[torch.Tensor]:
        """The reference's outputs on `draw()`, a fresh copy of the input set (upcast, then let go)."""
        if self.dtype == "float64":
            try:
                inputs = _upcast(draw(), torch.float64)  # (drawn as get_inputs draws them, then upcast)
                with torch.no_grad(), _tf32_off(), _default_dtype(torch.float64):
                    return flatten_outputs(self.model(*inputs), self.problem.where)
            except Exception as e:  # noqa: BLE001 - float64 unsupported by some op/device
                self.to_float32(_exc_line(e))
        with torch.no_grad(), _tf32_off():
            return flatten_outputs(self.model(*draw()), self.problem.where)


def _call_candidate(candidate, inputs, reference, policy, device):
    """Run the candidate once. Returns (flat outputs, early copies, settled copies, stream info,
    the output's structure)."""
    with torch.no_grad(), policy.active(), anticheat.reference_disabled(reference) as wire:
        stream_before = torch.cuda.current_stream(device) if device.type == "cuda" else None
        try:
            out = candidate(*inputs)
        except Exception as e:  # noqa: BLE001 - a failing candidate is a result
            if wire.called:
                raise _Fail("reference_fallback", anticheat.check_reference_fallback(wire)) from e
            raise _Fail("exception", f"candidate raised {_exc_line(e)}") from e
        stream_after = torch.cuda.current_stream(device) if device.type == "cuda" else None
        tensors = [o for o in _pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        early = [anticheat.snapshot(t) for t in tensors] if device.type == "cuda" else None
    _sync(device)
    reason = anticheat.check_reference_fallback(wire)
    if reason:
        raise _Fail("reference_fallback", reason)
    reason = anticheat.check_patched_timers()
    if reason:
        raise _Fail("patched_timers", reason)
    try:
        flat, structure = output_tree(out, "candidate")
    except Exception as e:  # noqa: BLE001
        raise _Fail("outputs", str(e).removeprefix("candidate: ")) from e
    settled = [anticheat.snapshot(t) for t in flat]
    return flat, early, settled, (stream_before, stream_after), structure


def verify(
    problem,
    candidate_factory: Callable[[torch.nn.Module], Callable],
    policy,
    device: str | torch.device = "cpu",
    n_sets: int = 5,
    seed0: int = 1000,
) -> VerifyResult:
    """Verify the candidate built by `candidate_factory(reference_model)` against `problem`.

    The reference model's weights reach the candidate through the factory (e.g. by loading its
    state_dict into a ModelNew). Problem errors (a reference that cannot run) propagate as
    ProblemError; everything the candidate does wrong is a failed VerifyResult.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    n_sets = max(2, int(n_sets))
    tol = float(policy.tol)
    checks = {name: "ok" for name in anticheat.CHECKS}
    if device.type != "cuda":
        checks["other_streams"] = f"skipped: no CUDA streams on {device.type}"
    result = VerifyResult(passed=False, excess=-math.inf, eager_excess=-math.inf, threshold=tol,
                          policy=policy.name, tol=tol, checks=checks)

    reference = problem.make_model(device)
    high = _HighPrecisionReference(problem, reference, device)

    cand_exc: list[float] = []  # per output, max over sets and runs
    eager_exc: list[float] = []

    def finish(fail: _Fail | None) -> VerifyResult:
        result.reference_dtype, result.reference_fallback = high.dtype, high.fallback_reason
        result.excess = max(cand_exc, default=result.excess)
        result.eager_excess = max(eager_exc, default=result.eager_excess)
        result.thresholds = [_threshold(tol, e) for e in eager_exc]
        result.threshold = max(result.thresholds, default=tol)
        for s in result.sets:
            s.passed = all(c <= t for c, t in zip(s.output_excess, result.thresholds))
        if fail is None:
            over = [i for i, (c, t) in enumerate(zip(cand_exc, result.thresholds)) if not c <= t]
            if over:
                i = over[0]
                why = next((r for s in result.sets for r in s.reasons if r.startswith(f"output {i}:")), None)
                msg = why or (f"output {i}: excess {cand_exc[i]:.3g} > threshold {result.thresholds[i]:.3g} "
                              f"(tol {tol:g}, eager excess {eager_exc[i]:.3g})")
                fail = _Fail("excess", msg)
        if fail is not None:
            result.passed = False
            result.reason = fail.reason
            result.failed_check = fail.check
            if fail.check in result.checks:
                result.checks[fail.check] = fail.reason
        else:
            result.passed = True
        return result

    try:
        try:
            with torch.no_grad(), policy.active():
                candidate = candidate_factory(reference)
        except Exception as e:  # noqa: BLE001
            raise _Fail("build", f"building the candidate raised {_exc_line(e)}") from e
        reason = anticheat.check_patched_timers()
        if reason:
            raise _Fail("patched_timers", reason)

        first: dict[str, list] = {}
        for k in range(n_sets):
            seed = seed0 + k
            inputs_k = _InputSet(problem, seed, device)
            # what the candidate starts each call of this set from (after the first set: the buffers
            # the forward updates)
            state = _buffers(reference, None if k == 0 else updated)
            # every call of a set starts from the same random state, so random ops (dropout in
            # training mode, rand_like) draw the same numbers in the reference, eager and the
            # candidate when the candidate draws as the model does
            torch.manual_seed(seed)
            hi = [park(h) for h in high(inputs_k.fresh)]  # (a large one rounded to float32 or in host memory: compare.park)
            inputs = inputs_k.fresh()
            before = _snapshots(inputs)
            torch.manual_seed(seed)
            with eager_under(policy, problem.where, device):
                eager, structure = output_tree(reference(*inputs), problem.where)
            _sync(device)
            n_out = len(eager)
            if k == 0 and high.dtype == "float64":
                # a float64 reference that is not finite where the model under the policy is (a
                # library op's float64 path on values its fast path handles) is no yardstick; only
                # outputs whose reference has a non-finite element are compared here (the full
                # comparison of every output comes below)
                why = next((f"output {i}: {r}" for i, (e, h) in enumerate(zip(eager, hi))
                            if isinstance(h, torch.Tensor) and not bool(torch.isfinite(h).all())
                            and (r := excess_reason(e, h, tol, dtype=e.dtype)[1]) and REFERENCE_NOT_FINITE in r), None)
                if why:
                    high.to_float32(f"the float64 reference is not finite where the model is ({why})")
                    torch.manual_seed(seed)
                    hi = [park(h) for h in high(inputs_k.fresh)]
            # buffers the forward updates (running statistics, an EMA) are outputs too: the
            # candidate's after its call against the reference's after its one call
            if k == 0:  # (the buffers the first call moves, restored before each candidate call and
                # compared in every set; not compared against a float32 reference, which starts from
                # fresh buffers)
                updated = [name for name, v in _buffers(reference).items() if not torch.equal(v, state[name])]
                moved = updated if high.dtype == "float64" else []
            state = {name: state[name] for name in updated}  # (only these are restored)
            if moved:
                if high.dtype != "float64":
                    raise RuntimeError(f"{problem.where}: the float64 reference failed after the first input set")
                eager = eager + [dict(reference.named_buffers())[name].detach().clone() for name in moved]
                hi = hi + [dict(high.model.named_buffers())[name] for name in moved]
            ref_mutates = anticheat.check_input_mutation(inputs, before) is not None
            ref_aliases = [anticheat.aliases_any(o, inputs) for o in eager]
            del inputs, before  # (each candidate call gets a fresh copy)
            if len(hi) != len(eager):  # (buffers were added to both alike)
                raise RuntimeError(f"{problem.where}: float64 and float32 references return different output counts")
            if not eager_exc:
                eager_exc = [-math.inf] * len(eager)
                cand_exc = [-math.inf] * len(eager)
            set_res = SetResult(seed=seed, excess=-math.inf, eager_excess=-math.inf,
                                output_excess=[-math.inf] * len(eager))
            result.sets.append(set_res)
            # (a generator, so no loop variable keeps an output alive after the loop)
            for i, x in enumerate(excess_reason(e, h, tol, dtype=e.dtype)[0] for e, h in zip(eager, hi)):
                eager_exc[i] = max(eager_exc[i], x)
                set_res.eager_excess = max(set_res.eager_excess, x)

            def run(draw, *, full_checks: bool, delay: bool = False):
                poison = [poisoned_like(o) for o in eager]  # leave NaN in the allocator's free blocks
                del poison
                cand_inputs = draw()
                before = _snapshots(cand_inputs) if full_checks else None
                _restore_buffers(candidate, state)
                torch.manual_seed(seed)
                outs, early, settled, streams, got = _call_candidate(candidate, cand_inputs, reference, policy, device)
                if not full_checks:
                    return outs, settled
                if len(outs) != n_out:
                    raise _Fail("outputs", f"returned {len(outs)} output(s), expected {n_out}")
                if got != structure:
                    raise _Fail("outputs", f"returned {got}, the model returns {structure}")
                for name, reason in (
                    ("lazy_results", anticheat.check_lazy_results(outs)),
                    ("output_memory", anticheat.check_output_memory(outs, eager, cand_inputs, ref_aliases)),
                    ("input_mutation", anticheat.check_input_mutation(cand_inputs, before, ref_mutates)),
                    ("other_streams", anticheat.check_other_streams(early, settled, device, *streams)),
                ):
                    if reason:
                        raise _Fail(name, reason)
                if delay:
                    time.sleep(_DEFERRED_DELAY_S)
                    _sync(device)
                    reason = anticheat.check_deferred_values(settled, outs)
                    if reason:
                        raise _Fail("lazy_results", reason)
                if moved:
                    bufs = dict(candidate.named_buffers())
                    outs = outs + [bufs[k] for k in moved]
                for i, (o, h, e) in enumerate(zip(outs, hi, eager)):
                    if o.device != e.device:
                        x, why = math.inf, f"output on {o.device}, expected {e.device}"
                    else:
                        # under bf16 autocast eager may return bf16 where the model (and a drop-in
                        # replacement) returns float32: then only the kind (float) must match
                        want = e.dtype if policy.autocast_dtype is None else None
                        x, why = excess_reason(o, h, tol, dtype=want)
                    cand_exc[i] = max(cand_exc[i], x)
                    set_res.output_excess[i] = max(set_res.output_excess[i], x)
                    set_res.excess = max(set_res.excess, x)
                    if why and len(set_res.reasons) < 4:
                        set_res.reasons.append(f"output {i}: {why}")
                return outs, settled

            settled_a = run(inputs_k.fresh, full_checks=True, delay=(k == 0))[1]
            if k < 2:
                first[f"cand{k}"] = settled_a
                first[f"ref{k}"] = [anticheat.snapshot(o) for o in eager[:n_out]]
            if k == 1:
                # (an output eager itself misses the reference by more than UNREPRODUCIBLE is no
                # function of the inputs to hold a candidate to: uninitialised memory, such as the
                # random-number seed an attention op returns unused)
                skip = {i for i, x in enumerate(eager_exc[:n_out]) if not x <= UNREPRODUCIBLE}
                reason = anticheat.check_constant_outputs(first["ref0"], first["ref1"], first["cand0"], first["cand1"],
                                                          skip)
                first.clear()
                if reason:
                    raise _Fail("constant_outputs", reason)
            del settled_a
            # other inputs in between: stale memory now holds other values
            run(lambda: problem.make_inputs(seed0 - 1, device), full_checks=False)
            run(inputs_k.fresh, full_checks=True)
            del inputs_k, hi, eager
    except _Fail as f:
        return finish(f)
    return finish(None)


def _buffers(model, names=None) -> dict[str, torch.Tensor]:
    """Copies of `model`'s buffers (those in `names`, when given) by name ({} for a candidate that
    is no module)."""
    if not isinstance(model, torch.nn.Module):
        return {}
    return {k: v.detach().clone() for k, v in model.named_buffers() if names is None or k in names}


def _restore_buffers(candidate, state: dict[str, torch.Tensor]) -> None:
    """Set the candidate's buffers named in `state` (those the reference's forward updates) to the
    reference's values before its call of the set: the candidate is called three times a set, the
    reference once, and a forward that updates its buffers must start each call where the
    reference started. Buffers the forward only reads are left alone: writing them would move their
    versions, which the emitted forward's per-version caches (a causal mask's check) follow."""
    if not state or not isinstance(candidate, torch.nn.Module):
        return
    with torch.no_grad():
        for k, v in candidate.named_buffers():
            if k in state and v.shape == state[k].shape:
                v.copy_(state[k])


def _threshold(tol: float, eager: float) -> float:
    if not math.isfinite(eager):
        return tol  # eager itself is non-finite where the reference is not: no floor from it
    return max(tol, 4.0 * eager)
