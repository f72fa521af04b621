"""Training-step benchmark: a problem's model trained for a few steps under each implementation
(eager, torch.compile, torch.compile with kernelwright's backend), from identical weights on
identical data, in train() mode.

One step is: zero the gradients, forward, the loss (the mean square of every floating output, so
any model trains without labels), backward, an SGD step. Under the bf16 policy every
implementation's forward and loss run in bf16 autocast (the backward outside it), as a PyTorch
user trains in mixed precision; the backend then sees graphs whose casts autocast made. Each
implementation reports

- ``step_ms``: the median device time of one step (CUDA events) over the last `timed` steps,
- ``first_s``: the wall time of the first step (Dynamo's capture and the backend's optimisation),
- ``grad_excess``: the excess over allclose (verify.compare) of its first step's loss and every
  parameter gradient against float64 eager, under the policy's tolerance: at most ``tol`` is
  correct (the verification protocol of docs/design.md, applied to the backward),
- ``loss_drift``: the largest relative difference of its loss curve from eager's (training is
  chaotic over many steps: reported, not judged), and ``losses``, the curve itself (one loss a
  step; scripts/loss_curves.py draws the curves of a bench JSON),
- ``peak_mib``: the peak GPU memory of its steps,
- ``host_ms``: on a GPU, the median wall time the host takes to issue one step (from a synchronised
  start to the step's return, not waiting for the GPU): a step whose ``host_ms`` reaches its
  ``step_ms`` waits on Python, not on kernels,
- ``host_top``: on a GPU, where that host time goes: the HOST_ROWS functions of most own time
  (cProfile over HOST_STEPS steps), ``[function, ms per step, calls per step]``,
- ``kernels``: on a GPU, the kernels of one more step (torch.profiler, after an L2 flush):
  ``[name, us per step, launches per step]``, longest first, the first KERNEL_ROWS of them (which
  kernels make one implementation's step slower than another's).
"""
from __future__ import annotations

import contextlib
import copy
import time
from typing import Callable

import torch

from kernelwright.errors import UserError
from kernelwright.problem.load import Problem, flatten_outputs
from kernelwright.verify.compare import excess

LR = 1e-3  # small enough for every shipped model to train without overflow for a few hundred steps
KERNEL_ROWS = 25  # kernels kept per implementation (the rest of a step's time is summed into one row)
HOST_STEPS, HOST_ROWS = 10, 20  # steps profiled on the host, functions kept


def loss_of(out) -> torch.Tensor:
    """The mean square of every floating output, in float32 (float64 for float64 outputs)."""
    outs = [o for o in flatten_outputs(out) if o.is_floating_point()]
    if not outs:
        raise UserError("the model returns no floating tensor to train on")
    return sum(o.to(torch.promote_types(o.dtype, torch.float32)).square().mean() for o in outs)


def _first_grads(model: torch.nn.Module, inputs: list) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    loss = loss_of(model(*inputs))
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]


def _reference(model: torch.nn.Module, inputs: list):
    """Loss and gradients of float64 eager on the same weights and data."""
    m64 = copy.deepcopy(model).double()
    x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return _first_grads(m64, x64)


def _grad_excess(loss, grads, ref_loss, ref_grads, tol: float) -> float:
    worst = excess(loss.reshape(1), ref_loss.reshape(1), tol)
    for g, r in zip(grads, ref_grads):
        if (g is None) != (r is None):
            return float("inf")
        if g is not None:
            worst = max(worst, excess(g, r, tol))
    return worst


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def train_impl(base: torch.nn.Module, inputs: list, wrap: Callable[[torch.nn.Module], Callable], steps: int,
               timed: int, device, autocast: Callable[[], object] = contextlib.nullcontext) -> dict:
    """Train a copy of `base`, called through `wrap(copy)`, for `steps` SGD steps on `inputs`; each
    step's forward and loss inside `autocast()` (a policy's baseline context)."""
    model = copy.deepcopy(base)
    fn = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    first_s, grads = 0.0, []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        timing = cuda and i >= steps - timed
        if timing:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with autocast():
            loss = loss_of(fn(*inputs))
        loss.backward()
        if i == 0:
            grads = [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]
        opt.step()
        if timing:
            end.record()
            times.append((start, end))
        if i == 0:
            _sync(device)
            first_s = time.perf_counter() - t0
        losses.append(loss.detach())
    _sync(device)
    step_ms = sorted(s.elapsed_time(e) for s, e in times)
    peak = round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_of(fn(*inputs))
        loss.backward()
        opt.step()

    return {"losses": [float(x) for x in losses], "first_loss": losses[0], "grads": grads,
            "step_ms": step_ms[len(step_ms) // 2] if step_ms else None, "first_s": round(first_s, 6),
            "peak_mib": peak, "host_ms": host_ms(step) if cuda else None,
            "host_top": host_top(step) if cuda else None, "kernels": step_kernels(step, device) if cuda else None}


def host_ms(step: Callable[[], None], runs: int = 10) -> float:
    """The median wall time of issuing one `step` from a synchronised start (the GPU idle), in ms."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return round(sorted(times)[len(times) // 2], 4)


def host_top(step: Callable[[], None]) -> list:
    """The functions of most own time over HOST_STEPS calls of `step` (cProfile): [where, ms per
    step, calls per step] rows, HOST_ROWS of them."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(HOST_STEPS):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:HOST_ROWS]
    return [[f"{name} ({'/'.join(file.rsplit('/', 2)[-2:])}:{line})",
             round(own * 1e3 / HOST_STEPS, 4), round(calls / HOST_STEPS, 1)]
            for (file, line, name), (_, calls, own, _, _) in rows]


def step_kernels(step: Callable[[], None], device) -> list:
    """The kernels of one call of `step` (measure.profile, after an L2 flush): [name, us, launches]
    rows, longest first; past KERNEL_ROWS the rest are summed into one "(N more kernels)" row."""
    from kernelwright.measure.profile import kernel_times

    rows = kernel_times(step, calls=1, warmup=1, device=device)
    out = [[k.name, round(k.us_per_call, 2), k.launches_per_call] for k in rows[:KERNEL_ROWS]]
    rest = rows[KERNEL_ROWS:]
    if rest:
        out.append([f"({len(rest)} more kernels)", round(sum(k.us_per_call for k in rest), 2),
                    sum(k.launches_per_call for k in rest)])
    return out


def train_problem(problem: Problem, policy, impls: dict[str, Callable[[torch.nn.Module], Callable]], steps: int = 100,
                  timed: int = 30, device="cuda") -> dict:
    """One bench row: each implementation in `impls` (name -> wrap) trained from the same weights.
    ``times`` holds the median step times, ``correct`` says whether every implementation's first
    step matched float64 eager (loss and every gradient within the policy's tolerance)."""
    if steps < 2 or not 1 <= timed < steps:
        raise UserError(f"bench --train: need steps >= 2 and 1 <= timed steps < steps (got {steps}, {timed})")
    p = problem.in_mode(True)
    base = p.make_model(device)
    if not any(w.requires_grad for w in base.parameters()):
        raise UserError(f"{problem.name}: the model has no parameters to train")
    inputs = p.make_inputs(1, device)
    ref_loss, ref_grads = _reference(base, inputs)
    row: dict = {"problem": problem.name, "level": problem.level, "times": {}, "train": {}}
    eager_losses = None
    with policy.active():
        for name, wrap in impls.items():
            r = train_impl(base, inputs, wrap, steps, timed, device, lambda: policy.baseline(device))
            ex = _grad_excess(r.pop("first_loss"), r.pop("grads"), ref_loss, ref_grads, policy.tol)
            losses = r.pop("losses")
            if eager_losses is None:
                eager_losses = losses
            drift = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, eager_losses))
            row["train"][name] = dict(r, grad_excess=ex, loss_drift=drift, last_loss=losses[-1], losses=losses,
                                      correct=ex <= policy.tol)
            if r["step_ms"] is not None:
                row["times"][name] = r["step_ms"]
    row["correct"] = all(v["correct"] for v in row["train"].values())
    return row


def run_train_bench(files, policy, impls: dict, steps: int, timed: int, json_out, echo, small: bool = False,
                    device="cuda") -> tuple[list[dict], dict]:
    """`train_problem` over problem files, one table line per problem as it finishes, per-level
    geometric means of the step-time ratios (bench.runner.summarise) at the end."""
    import json
    from pathlib import Path

    from kernelwright.bench.runner import summarise
    from kernelwright.problem import load_problem

    rows: list[dict] = []
    echo(f"{len(files)} problems, training steps ({steps}, the last {timed} timed), precision {policy.name}")
    echo(f"{'problem':34s} {'eager ms':>9s} {'compile ms':>10s} {'kw ms':>9s} {'ok':>3s} {'vs compile':>10s} "
         f"{'kw first s':>10s}")
    for f in files:
        start = time.perf_counter()
        try:
            row = train_problem(load_problem(f, small=small), policy, impls, steps, timed, device)
        except Exception as e:  # noqa: BLE001 - a failing problem is a row
            row = {"problem": Path(f).stem, "level": None, "correct": False,
                   "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        row["path"] = str(f)
        row["wall_s"] = round(time.perf_counter() - start, 2)
        if "kernelwright" in row.get("train", {}):
            row["correct"] = row["train"]["kernelwright"]["correct"]  # what summarise counts
        rows.append(row)
        t, tr = row.get("times", {}), row.get("train", {})
        kw, cp = t.get("kernelwright"), t.get("compile")
        line = (f"{('L' + str(row.get('level')) + ' ' + row['problem'])[:34]:34s} {t.get('eager', float('nan')):9.3f} "
                f"{cp or float('nan'):10.3f} {kw or float('nan'):9.3f} {'yes' if row.get('correct') else 'NO':>3s} "
                f"{(cp / kw) if kw and cp else float('nan'):10.2f} "
                f"{tr.get('kernelwright', {}).get('first_s', float('nan')):10.1f}")
        echo(line + (f"  ERROR {row['error'][:80]}" if row.get("error") else ""))
        summary = summarise(rows, baseline_only=False)
        if json_out:
            gpu = torch.cuda.get_device_name(0) if torch.device(device).type == "cuda" else "cpu"
            Path(json_out).write_text(json.dumps({"rows": rows, "summary": summary, "train": True, "gpu": gpu,
                                                  "options": {"precision": policy.name, "steps": steps, "timed": timed},
                                                  "torch": torch.__version__}, indent=2, default=str))
    summary = summarise(rows, baseline_only=False)
    for lvl, s in summary.items():
        echo(f"{lvl}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    return rows, summary
