"""The main job: capture, rewrite, plan, search, emit, check — for each training mode whose graph
differs — then write ModelNew, result.json and report.md.

    capture (capture/)      the model's ATen graph, per training mode (capture.modes)
    rewrite, plan (plan/)   exact rewrites, fusion units, GEMM + epilogue pairs
    search (search/)        every unit's choices timed alike: the library call and the generated
                            candidates (search/plan_search.py)
    emit (emit/)            model_new.py and its kernels
    check (measure/)        the emitted module verified, timed beside eager and torch.compile, and
                            its CUDA-graph replay chosen where faster (measure/final.py)

On a machine without a GPU, kernels run in the Triton interpreter, are verified, nothing is
timed, and each config is the cost model's pick (if it has data) or the template's default.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from kernelwright.analyze.coverage import captured_cost, plan_coverage
from kernelwright.capture import CaptureError, capture
from kernelwright.capture.execute import calibrate_strides
from kernelwright.capture.modes import training_modes
from kernelwright.capture.shapes import dense_permuted
from kernelwright.emit.module import (ModeForward, import_model_new, model_new_like, module_files, render_model_new,
                                    write_module)
from kernelwright.emit.report import write_report
from kernelwright.build.compile_ahead import workers_from_env
from kernelwright.measure import watchdog
from kernelwright.measure.baselines import EagerOutputs, baseline_output_dtypes, eager_outputs
from kernelwright.measure.final import OWN_FORWARD, final_checks, graphs_in_every_mode, not_shipped
from kernelwright.measure.memory import MemoryPeak
from kernelwright.measure.stored import StoredTimings, module_key
from kernelwright.plan import plan_graph
from kernelwright.plan.concat import place_concats
from kernelwright.plan.rewrites import rewrite
from kernelwright.policy import get_policy
from kernelwright.problem import Problem
from kernelwright.search.database import TrialDB, default_db_path
from kernelwright.search.plan_search import TrialProgress, tune_plan

__all__ = ["Options", "optimize_problem", "baseline_output_dtypes"]


@dataclass
class Options:
    budget_trials: int | None = 40
    budget_s: float | None = None
    precision: str = "fp32"
    device: str = "cpu"
    backend: str = "all"
    db_path: str | None = None
    small: bool = False
    cuda_graphs: bool = True  # also time the forward replayed as CUDA graphs; ship it when faster
    compile_mode: str = "default"  # torch.compile mode of the baseline the final timing compares with
    mode: str = "both"  # training modes to generate forwards for: train | eval | both (see optimize_problem)
    timed: bool = True  # on a GPU, tune by timing and time the result; False: verify only (configs untimed)
    # every unit that has a generated strategy uses it, even when the library call measures faster; for CPU
    # tests and for KernelBench-style comparisons without library kernels (search/plan_search.py reads it)
    no_library: bool = False
    no_rewrites: bool = False  # leave out the exact algebra rules of plan/algebra.py (they change what is computed)
    # plan/recompute.py's copies of cheap values into the kernels that read them; off: two A/B runs of
    # the ResNet block's training step disagree (7% faster, 10% slower; docs/benchmarks.md "Training layouts")
    recompute: bool = False
    # positions of returned values whose memory layout the pipeline chooses instead of eager's (an
    # AOTAutograd forward's saved tensors, which the backward takes in the strides reported for them)
    free_layouts: tuple[int, ...] = ()
    # whether a returned value may be a view of one the forward computes (plan.rewrites.returned_copies);
    # False for an AOTAutograd forward, whose results autograd.Function returns
    view_outputs: bool = True
    retune: bool = False  # search units the trial database measured before here (else their stored best runs alone)
    # "model": the expert seeds in order, then the cost model's picks; "random": every unit's seeds, then
    # its other configs in a uniformly random order, the seeds marked in the trial records (the samples
    # that search-efficiency studies replay)
    search: str = "model"
    log: Callable[[str], None] = print
    # called after every tuning trial with the unit's search.plan_search.TrialProgress (trials done, its
    # budget, the best time so far): the command line's live status line; None: nothing is reported
    progress: Callable[[TrialProgress], None] | None = None

    def mode_share(self, i: int, n: int) -> Options:
        """The options of the i-th of n training modes: the problem's budget split between them."""
        if n == 1:
            return self
        trials = None if self.budget_trials is None else max(1, (self.budget_trials + n - 1 - i) // n)
        return replace(self, budget_trials=trials, budget_s=None if self.budget_s is None else self.budget_s / n)


def optimize_problem(problem: Problem, out_dir: Path, opts: Options) -> dict:
    """Run the whole job for one problem; writes out_dir and returns result.json's content.

    A model whose result depends on its training mode (BatchNorm, Dropout, `self.training`
    branches: capture.modes) and whose graphs differ between the modes gets one generated
    forward per mode in `opts.mode` ("train", "eval" or "both"), each captured, tuned, verified
    and timed in its mode; the emitted module runs the original forward in a mode it has no
    forward for. result.json's top level describes the primary mode (train when tuned), and
    result["modes"] every tuned mode."""
    policy, device, log, started = get_policy(opts.precision), torch.device(opts.device), opts.log, time.time()
    timed = device.type == "cuda" and opts.timed
    watchdog.limit_seconds()  # a bad $KERNELWRIGHT_HANG_S is bad input, before any work
    workers_from_env(1)  # and so is a bad $KERNELWRIGHT_COMPILE_WORKERS
    memory = MemoryPeak(device)
    stages: dict[str, float] = {}  # wall seconds per stage, in result.json (where a run's time goes)
    lap = _laps(stages)
    eager = eager_outputs(problem, policy, device)  # eager runs here, before anything is written
    memory.mark("eager")
    lap("eager")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # capture, rewrite, plan and search, per training mode whose graph differs
    sensitive, modes, keys, graphs = training_modes(problem, opts.mode)
    lap("capture")
    log(f"modes: {', '.join(modes)}" + (f" (mode-dependent: {', '.join(n or 'the model' for n in sensitive)})"
                                         if sensitive else " (the result does not depend on the training mode)"))
    results: dict[str, dict] = {}
    forwards: dict[str, ModeForward] = {}
    for i, mode in enumerate(modes):
        p = _in_mode(problem, mode)  # (eager's output dtypes under autocast may differ by mode: a fast path)
        seen = eager if p.training == problem.training else eager_outputs(p, policy, device)
        forward, results[mode] = _generate(p, mode, policy, device, timed, out_dir / ".build" / mode,
                                           opts.mode_share(i, len(modes)), seen, keys[mode], graphs.get(mode))
        if forward is not None:
            forwards[mode] = forward
    memory.mark("tune")
    lap("tune")
    # emit, then check every mode: a generated forward that fails (or is slower than eager) is not shipped
    overrides = dict(getattr(problem._module, "SMALL", {}) or {}) if opts.small and problem._module else None
    notes: list[str] = []

    def emit(cuda_graphs=False) -> Path:
        shipped = [forwards[m] for m in modes if m in forwards]
        text = render_model_new(problem, shipped, policy.name, overrides, sensitive, cuda_graphs, device.type, notes)
        return write_module(out_dir, text, module_files(shipped))

    path = emit()
    log(f"wrote {path}")
    for mode in modes:
        r, p = results[mode], _in_mode(problem, mode)
        if mode in forwards:
            r["verify"], r["timing"] = _final_checks(p, path, policy, device, timed, log, opts.cuda_graphs,
                                                     opts.compile_mode, what=f"{mode} mode", memory=memory,
                                                     store=_store(p, opts, policy, device, timed, mode, overrides),
                                                     also=p.in_mode(not p.training) if mode == "any" else None)
            why = not_shipped(r)
            if why is None:
                continue
            log(f"{mode} mode: {why}: ModelNew keeps the original forward there")
            notes.append(("" if mode == "any" else f"{mode}: ") + f"original forward kept ({why})")
            del forwards[mode]
            path = emit()
        r["verify"], r["timing"] = _original_checks(p, path, policy, device, timed, log, opts.compile_mode)
    if forwards and graphs_in_every_mode([results[m]["timing"] for m in forwards]):
        path = emit(cuda_graphs=True)
    lap("emit and final checks")
    # result.json (the primary mode at the top level, every mode under "modes") and report.md
    plans = {m: results[m].pop("plan", None) for m in modes}
    primary = next(m for m in ("any", "train", "eval") if m in modes)
    result: dict = {"problem": problem.name, "path": str(problem.path) if problem.path else None,
                    "precision": policy.name, "device": str(device), "small": opts.small, **results[primary],
                    "mode": primary, "mode_modules": sensitive, "modes": {m: dict(results[m]) for m in modes},
                    "untuned_modes": [m for m in ("train", "eval") if sensitive and "any" not in modes and m not in modes],
                    "analysis": plan_coverage(plans[primary], results[primary]["groups"],
                                              results[primary].get("captured_cost")),
                    "seconds": round(time.time() - started, 2), "stages": stages, "memory": memory.report()}
    (out_dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
    write_report(out_dir, result)
    return result


def _laps(stages: dict[str, float]) -> Callable[[str], None]:
    """lap(name): the wall seconds since the last lap (or this call) go into stages[name]."""
    last = [time.time()]

    def lap(name: str) -> None:
        now = time.time()
        stages[name] = round(now - last[0], 2)
        last[0] = now
    return lap


def _in_mode(problem: Problem, mode: str) -> Problem:
    return problem if mode == "any" else problem.in_mode(mode == "train")


def _generate(problem: Problem, mode: str, policy, device, timed, cache_dir: Path, opts: Options,
              eager: EagerOutputs, keys: list[tuple], captured=None):
    """Capture (unless `captured` is the capture already made), rewrite, plan and tune `problem`
    (its models in `mode`): (the generated forward, or None when capture failed, and this mode's
    record for result.json, its plan under "plan"). `eager`: the dtypes and strides eager returns
    (the generated forward returns the same); `keys`: the submodules' training flags the forward
    answers for."""
    record: dict = {"capture": "ok", "groups": []}
    try:
        graph = captured if captured is not None else capture(problem)
        record["captured_cost"] = captured_cost(graph)
        graph, record["rewrites"] = rewrite(graph, policy.name, eager.dtypes, algebra=not opts.no_rewrites,
                                            recompute=opts.recompute, free=opts.free_layouts,
                                            view_outputs=opts.view_outputs)
        record["calibrated"] = _calibrated(graph, problem, policy, device)
        keep_output_layouts(graph, [None if i in opts.free_layouts else s for i, s in enumerate(eager.strides)])
        record["rewrites"] += place_concats(graph)
        plan = plan_graph(graph)
    except CaptureError as e:
        opts.log(("" if mode == "any" else f"{mode} mode: ") + f"capture failed: {e}; the original forward runs there")
        record["capture"] = str(e)
        return None, record
    try:
        tuned = tune_plan(problem, plan, policy, device, timed, cache_dir, opts, record)
    except Exception as e:  # noqa: BLE001 - a fault of ours: this mode keeps its original forward, said in one line
        if watchdog.is_device_fault(e):
            raise  # (the CUDA context is lost: nothing more can run in this process)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        opts.log(("" if mode == "any" else f"{mode} mode: ") + f"tuning failed ({type(e).__name__}: {first}); "
                 "the original forward runs there")
        record["capture"] = f"tuning failed: {type(e).__name__}: {first}"
        return None, record
    record["plan"] = plan
    return ModeForward(mode, plan, tuned.kernels, tuned.sources, tuned.summary, tuned.support, keys), record


def keep_output_layouts(graph, strides: list) -> None:
    """Give each value the forward returns (in order) the strides eager returns it with on the
    device (`strides`), where the rewrites (a convolution run channels-last) or the stride
    calibration (a library call on a channels-last input keeps that layout) left others: the
    kernels computing it then write eager's layout, and the emitted forward copies a library call's
    result into it (`_rt.eager_layout`)."""
    if len(strides) != len(graph.outputs):
        return
    for name, stride in zip(graph.outputs, strides):
        if graph.is_input(name) or stride is None:
            continue
        node = graph.node(name)
        meta = node.outs[0] if len(node.outs) == 1 else None
        if (meta is not None and len(meta.shape) == len(stride) and dense_permuted(meta.shape, stride)
                and tuple(meta.stride) != tuple(stride)):
            node.outs = [type(meta)(meta.shape, tuple(stride), meta.dtype)]


def _calibrated(graph, problem, policy, device) -> list[str] | str:
    """calibrate_strides on this device (the nodes whose strides it changed), or why it could not
    run (the tuning's own run of the graph then reports the fault)."""
    try:
        with torch.no_grad(), policy.active():
            return calibrate_strides(graph, problem.make_model(device), problem.make_inputs(0, device))
    except Exception as e:  # noqa: BLE001 - the metadata stays as captured
        if watchdog.is_device_fault(e):
            raise
        return f"not calibrated: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def _store(problem, opts: Options, policy, device, timed: bool, mode: str, overrides: dict | None):
    """(the stored timings, the context of their key) for a problem file timed on a GPU; else None."""
    if not timed or not problem.source:
        return None
    timings = StoredTimings(TrialDB(default_db_path(opts.db_path)), torch.cuda.get_device_name(device), policy.name)
    return timings, (problem.source, overrides, opts.compile_mode, opts.cuda_graphs, mode), opts.retune


def _final_checks(problem, path, policy, device, timed, log, cuda_graphs=False, compile_mode="default", what=None,
                  memory=None, store=None, also=None):
    """measure.final_checks on the module written at `path`, its ModelNew built with the reference's
    weights. `store` (from `_store`): its timing of these files is reused unless retuning, and a new
    one is kept. `also`: the problem in the other training mode, verified too (final_checks)."""
    mod = import_model_new(path)
    stored = keep = None
    if store is not None:
        timings, context, retune = store
        key = module_key(path, *context)
        stored = None if retune else timings.get(key)
        keep = (lambda timing: timings.put(key, timing))

    def build(reference, graphs=False):
        m = model_new_like(mod, problem, reference, device)
        m._kw_cuda_graphs = graphs
        return m

    return final_checks(problem, mod, build, policy, device, timed, log, cuda_graphs, compile_mode, what, memory,
                        stored, keep, also)


def _original_checks(problem, path, policy, device, timed, log, compile_mode):
    """The checks of a module that runs the model's own forward (nothing generated, or a generated
    program not shipped): a KernelBench file's ModelNew is verified and timed as any module; a live
    module's attach() keeps the module's own forward (measure.final.OWN_FORWARD: nothing to verify)."""
    if problem.source:
        return _final_checks(problem, path, policy, device, timed, log, compile_mode=compile_mode)
    log("verify: skipped (the module keeps its own forward)")
    return dict(OWN_FORWARD), None
