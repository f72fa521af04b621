"""Baselines (eager PyTorch and torch.compile) and timing a problem's implementations together.

Everything is timed in one interleaved run under the same precision policy (matched precision);
the model is built once, compile warm-up runs before timing, inputs are drawn once on the device.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from kernelwright.measure.timer import require_gpu, time_interleaved
from kernelwright.problem.load import eager_under, flatten_outputs

__all__ = ["Baselines", "EagerOutputs", "Timings", "baseline_output_dtypes", "eager_outputs", "make_baselines", "time_problem"]


class EagerOutputs(NamedTuple):
    dtypes: list | None  # what eager returns under the policy's autocast (bf16); None for the others
    strides: list  # each output's strides on the device (None for a non-tensor output)


def eager_outputs(problem, policy, device) -> EagerOutputs:
    """Run eager once on `device` under the policy, before any work: a model that cannot run there
    is a ProblemError, in one line (oneDNN has no bf16 LSTM on the CPU; a model that builds CPU
    index tensors in its forward fails on a GPU; a data-dependent error the meta-device check
    cannot see). Returns the dtypes eager returns under the policy's autocast (bf16), output by
    output (None for the other policies), and the strides it returns them with."""
    with eager_under(policy, problem.where, device):
        outs = problem.make_model(device)(*problem.make_inputs(0, device))
    flat = flatten_outputs(outs, problem.where)
    strides = [tuple(o.stride()) if isinstance(o, torch.Tensor) else None for o in flat]
    return EagerOutputs(None if policy.autocast_dtype is None else [o.dtype for o in flat], strides)


def baseline_output_dtypes(problem, policy, device) -> list | None:
    """`eager_outputs`' dtypes."""
    return eager_outputs(problem, policy, device).dtypes


class Baselines(dict):
    """name -> callable(*inputs); `errors` holds name -> one-line reason for baselines that failed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: dict[str, str] = {}


class Timings(dict):
    """name -> Timing; `errors` holds name -> reason for implementations that could not be timed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: dict[str, str] = {}
        self.kernels: dict[str, list] = {}  # name -> [KernelTime], when profiled
        self.kernels_error: str | None = None
        self.syncs: dict[str, str] = {}  # name -> where one call first waits for the GPU, when it does

    def to_json(self) -> dict:
        return {"timings": {k: v.to_json() for k, v in self.items()}, "errors": dict(self.errors)}


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _in_context(fn: Callable, policy, device) -> Callable:
    """`fn` called inside the policy's baseline context (bf16 autocast under `bf16`), else `fn`."""
    if policy.autocast_dtype is None:
        return fn

    def run(*inputs):
        with policy.baseline(device):
            return fn(*inputs)

    return run


def make_baselines(
    problem,
    policy,
    device,
    compile_mode: str | None = "default",
    inputs: list | None = None,
    include_compile: bool = True,
    model: torch.nn.Module | None = None,
) -> Baselines:
    """{"eager": model, "compile": torch.compile(model) in `compile_mode`}, callables taking
    the problem's inputs (under bf16 both are wrapped to run in bf16 autocast). The model is
    built once (or `model` is used). With `inputs`, the compiled callable is run once under the
    policy here, so compilation and autotuning stay out of timing. A compile failure leaves its
    key out and its reason in `.errors`."""
    model = problem.make_model(device) if model is None else model
    out = Baselines(eager=_in_context(model, policy, device))
    if not include_compile:
        return out
    key = "compile"  # whatever the mode: callers know which one they asked for
    if torch._guards.CompileContext.try_get() is not None:
        # called from a torch.compile backend (kernelwright's): a nested compile's reset frees the
        # outer compile's frame caches while it still writes to them (a segfault in Dynamo)
        out.errors[key] = "not compiled inside a torch.compile backend"
        return out
    try:
        torch._dynamo.reset()  # fresh caches: earlier problems' graphs and recompile counts
        with policy.active():  # inductor reads the TF32 switches while compiling
            compiled = _in_context(torch.compile(model, mode=None if compile_mode in (None, "default") else compile_mode),
                                   policy, device)
            if inputs is not None:
                with torch.no_grad():
                    compiled(*inputs)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize(device)
        out[key] = compiled
    except Exception as e:  # noqa: BLE001 - a failed baseline is a result
        out.errors[key] = _line(e)
    return out


def time_problem(
    problem,
    policy,
    device="cuda",
    candidates: dict[str, Callable] | None = None,
    seed: int = 0,
    compile_mode: str | None = "default",
    include_compile: bool = True,
    warmup_s: float = 0.2,
    min_runs: int = 50,
    max_runs: int = 1000,
    budget_s: float | None = None,
    flush: bool = True,
    profile_calls: int = 0,
) -> Timings:
    """Time eager, torch.compile and `candidates` (name -> callable(*inputs)) in one interleaved
    run under `policy`, on one set of inputs drawn on the device. Returns name -> Timing. With
    `profile_calls`, each implementation is then profiled that many calls and `.kernels` maps its
    name to the kernels it launches per call (or `.kernels_error` says why profiling failed)."""
    dev = require_gpu(device)
    candidates = dict(candidates or {})
    inputs = problem.make_inputs(seed, dev)
    timings = Timings()
    with torch.no_grad(), policy.active():
        base = make_baselines(problem, policy, dev, compile_mode, inputs=inputs, include_compile=include_compile)
        timings.errors.update(base.errors)
        impls: dict[str, Callable] = dict(base)
        for name, fn in candidates.items():
            if name in impls:
                raise ValueError(f"candidate name {name!r} clashes with a baseline")
            try:  # first call outside timing; a candidate that fails here is reported, not timed
                fn(*inputs)
            except Exception as e:  # noqa: BLE001
                timings.errors[name] = _line(e)
                continue
            impls[name] = fn
        fns = {name: _bind(fn, inputs) for name, fn in impls.items()}
        timings.update(time_interleaved(fns, warmup_s=warmup_s, min_runs=min_runs, max_runs=max_runs,
                                        flush=flush, budget_s=budget_s, device=dev))
        if profile_calls:
            from kernelwright.measure.profile import kernel_times

            try:
                timings.kernels = {name: kernel_times(fn, calls=profile_calls, device=dev) for name, fn in fns.items()}
            except Exception as e:  # noqa: BLE001 - profiling is a diagnostic; timing stands without it
                timings.kernels_error = _line(e)
            timings.syncs = {name: where for name, fn in fns.items() if (where := first_sync(fn))}
    return timings


def first_sync(fn: Callable[[], Any]) -> str | None:
    """Where one call of `fn` makes the host wait for the GPU (an .item(), a copy to pageable host
    memory, ...): 'file:line function' of the innermost frame outside torch; None when it never
    does. A forward that waits cannot run ahead of the GPU, so its launch overhead is not hidden."""
    import traceback
    import warnings

    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    try:
        with warnings.catch_warnings():  # "a prototype feature" (it is: a None here is not a proof)
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        fn()
        return None
    except RuntimeError as e:
        if "synchroniz" not in str(e):
            return None  # failed for another reason: not this check's business
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/torch/" not in f.filename]
        f = frames[-1] if frames else traceback.extract_tb(e.__traceback__)[-1]
        return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}: {_line(e)[:120]}"
    finally:
        torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.synchronize()


def _bind(fn: Callable, inputs: list) -> Callable[[], Any]:
    return lambda: fn(*inputs)
