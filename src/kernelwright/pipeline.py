"""The main job: capture, plan, generate, verify, time and search, then emit ModelNew + report.

Per fusion group, the library path (the group's ATen ops run by PyTorch) is always a candidate,
so a group only runs a generated kernel when that kernel is verified and measured faster. On a
machine without a GPU, kernels run in the Triton interpreter, are verified, nothing is timed,
and the config is the cost model's pick (if it has data) or the documented heuristic.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from kernelwright.capture import CaptureError, capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import cuda_unit, gemm_epilogue
from kernelwright.codegen.cuda_kernels import runtime_source
from kernelwright.codegen.node_kernels import absorbed, template_for
from kernelwright.codegen.triton_group import Unsupported
from kernelwright.capture.modes import mode_modules
from kernelwright.emit.module import (ModeForward, import_model_new, model_new_like, module_files, render_model_new,
                                    write_module)
from kernelwright.errors import UserError
from kernelwright.measure import watchdog
from kernelwright.plan import Plan, plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.plan.weights import weight_only, weight_roots
from kernelwright.policy import get_policy
from kernelwright.problem import Problem
from kernelwright.problem.load import eager_under
from kernelwright.search import CostModel, Exhaustive, RunResult, TrialDB, default_db_path, packaged_priors, tune
from kernelwright.search.budget import shares
from kernelwright.search.database import record_result
from kernelwright.search.units import (CudaTuner, GemmTuner, GroupTuner, KernelTuner, NodeTuner, group_impl,
                                      kernel_resources)
from kernelwright.space.config import Config


@dataclass
class GroupResult:
    id: str
    kind: str
    ops: list[str]
    strategy: str = "library"  # "triton" (generated kernel) | "torch" (library layout variant) | "library"
    config: dict | None = None
    time_ms: float | None = None  # chosen implementation
    library_ms: float | None = None
    excess: float | None = None
    eager_excess: float | None = None
    bytes: int = 0
    gbps: float | None = None
    trials: int = 0
    failed: int = 0
    note: str = ""
    resources: dict = field(default_factory=dict)


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
    log: Callable[[str], None] = print


def optimize_problem(problem: Problem, out_dir: Path, opts: Options) -> dict:
    """Run the whole job for one problem; writes out_dir and returns result.json's content.

    A model whose result depends on its training mode (BatchNorm, Dropout, `self.training`
    branches: capture.modes) and whose graphs differ between the modes gets one generated
    forward per mode in `opts.mode` ("train", "eval" or "both"), each captured, tuned, verified
    and timed in its mode; the emitted module runs the original forward in a mode it has no
    forward for. result.json's top level describes the primary mode (train when tuned), and
    result["modes"] every tuned mode."""
    policy = get_policy(opts.precision)
    device = torch.device(opts.device)
    timed = device.type == "cuda" and opts.timed
    watchdog.limit_seconds()  # a bad $KERNELWRIGHT_HANG_S is bad input, before any work
    log = opts.log
    started = time.time()
    memory = _MemoryPeak(device)
    out_dtypes = baseline_output_dtypes(problem, policy, device)  # eager runs here, before anything is written
    memory.mark("eager")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = dict(getattr(problem._module, "SMALL", {}) or {}) if opts.small and problem._module else None
    sensitive, modes, keys, graphs = _modes(problem, opts.mode)
    log(f"modes: {', '.join(modes)}" + (f" (mode-dependent: {', '.join(n or 'the model' for n in sensitive)})"
                                         if sensitive else " (the result does not depend on the training mode)"))
    results: dict[str, dict] = {}
    forwards: dict[str, ModeForward] = {}
    for i, mode in enumerate(modes):
        mode_opts = _mode_share(opts, i, len(modes))
        forward, results[mode] = _generate(_in_mode(problem, mode), mode, policy, device, timed,
                                           out_dir / ".build" / mode, mode_opts, out_dtypes, keys[mode],
                                           graphs.get(mode))
        if forward is not None:
            forwards[mode] = forward
    memory.mark("tune")
    notes: list[str] = []

    def emit(cuda_graphs=False) -> Path:
        shipped = [forwards[m] for m in modes if m in forwards]
        text = render_model_new(problem, shipped, policy.name, overrides, sensitive, cuda_graphs, device.type, notes)
        return write_module(out_dir, text, module_files(shipped))

    path = emit()
    log(f"wrote {path}")
    for mode in modes:
        r = results[mode]
        p = _in_mode(problem, mode)
        if mode not in forwards:
            r["verify"], r["timing"] = _original_checks(p, path, policy, device, timed, log, opts)
            continue
        r["verify"], r["timing"] = _final_checks(p, path, policy, device, timed, log, cuda_graphs=opts.cuda_graphs,
                                                 compile_mode=opts.compile_mode, what=f"{mode} mode", memory=memory)
        why = _not_shipped(r)
        if why is not None:  # the original forward runs in this mode instead
            log(f"{mode} mode: {why}: ModelNew keeps the original forward there")
            notes.append(("" if mode == "any" else f"{mode}: ") + f"original forward kept ({why})")
            del forwards[mode]
            path = emit()
            r["verify"], r["timing"] = _original_checks(p, path, policy, device, timed, log, opts)
    graphed = [m for m in forwards if (results[m]["timing"] or {}).get("cuda_graphs")]
    if forwards and len(graphed) == len(forwards):  # measured faster replayed in every mode
        path = emit(cuda_graphs=True)
    elif graphed:
        for m in graphed:  # (the plain forward ships: it timed so)
            results[m]["timing"]["kernelwright"] = results[m]["timing"].get(PLAIN, results[m]["timing"]["kernelwright"])
            results[m]["timing"]["cuda_graphs"], results[m]["timing"]["cuda_graphs_why"] = False, "not faster in every mode"
    primary = next(m for m in ("any", "train", "eval") if m in modes)
    result: dict = {"problem": problem.name, "path": str(problem.path) if problem.path else None,
                    "precision": policy.name, "device": str(device), "small": opts.small, **results[primary],
                    "mode": primary, "mode_modules": sensitive,
                    "modes": {m: {k: v for k, v in results[m].items() if k != "plan"} for m in modes},
                    "untuned_modes": [m for m in ("train", "eval") if sensitive and "any" not in modes and m not in modes]}
    result.pop("plan", None)
    plan = results[primary].get("plan")
    result["analysis"] = _analysis(plan.graph if plan else None, plan, result)
    result["seconds"] = round(time.time() - started, 2)
    result["memory"] = memory.report()
    (out_dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
    from kernelwright.emit.report import write_report

    write_report(out_dir, result)
    return result


class _MemoryPeak:
    """Peak GPU memory, from the allocator's own statistics, of one eager forward (model, inputs,
    outputs, temporaries) and of each stage of the job after it: tuning, verification, timing."""

    def __init__(self, device: torch.device):
        self.device, self.peaks = device, {}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)

    def mark(self, stage: str) -> None:
        """The peak since the last mark belongs to `stage` (the largest, when a stage repeats)."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - self.base
            self.peaks[stage] = max(self.peaks.get(stage, 0), peak)
            torch.cuda.reset_peak_memory_stats(self.device)

    def report(self) -> dict | None:
        """Per stage (eager, tune, verify, timing) its peak in MiB, and each one's ratio to eager's;
        None off the GPU."""
        if self.device.type != "cuda" or "eager" not in self.peaks:
            return None
        eager = self.peaks["eager"]
        return {**{f"{k}_peak_mib": round(v / (1 << 20), 1) for k, v in self.peaks.items()},
                "ratio": round(max(self.peaks.values()) / eager, 2) if eager else None,
                "verify_tune_ratio": round(max(self.peaks.get("tune", 0), self.peaks.get("verify", 0)) / eager, 2)
                if eager else None}


def _modes(problem: Problem, wanted: str) -> tuple[list[str], list[str], dict[str, list[tuple]], dict]:
    """(mode-dependent submodules, the modes to generate a forward for, each mode's keys: the
    training flags of those submodules it answers for, the captures made to compare the modes,
    by mode). A model built with some submodules in eval mode (a frozen BatchNorm) keeps them so
    in its "train" mode. Without mode-dependent submodules, or when both modes capture the same
    graph, one forward serves both: ["any"]."""
    if wanted not in ("train", "eval", "both"):
        raise UserError(f"mode {wanted!r}: choose train, eval or both")
    sensitive = mode_modules(problem.make_model("meta"))
    if not sensitive:
        return [], ["any"], {"any": [()]}, {}
    train, evals = problem.in_mode(True), problem.in_mode(False)
    keys = {"train": [_flags(train, sensitive)], "eval": [_flags(evals, sensitive)]}
    graphs = {}
    for mode, p in (("train", train), ("eval", evals)):
        try:
            graphs[mode] = capture(p)
        except CaptureError:
            pass  # reported when that mode is captured again on its own
    if len(graphs) == 2 and _same_graph(graphs["train"], graphs["eval"]):
        return sensitive, ["any"], {"any": list(dict.fromkeys(keys["train"] + keys["eval"]))}, \
            {"any": graphs["train"]}
    return sensitive, ["train", "eval"] if wanted == "both" else [wanted], keys, graphs


def _flags(problem: Problem, names: list[str]) -> tuple[bool, ...]:
    """The training flags of submodules `names` of `problem`'s model."""
    model = problem.make_model("meta")
    return tuple(model.get_submodule(n).training for n in names)


def _same_graph(a, b) -> bool:
    """Whether two captures compute the same ops on the same values."""
    ops = lambda g: [(n.target, repr(n.args), repr(n.kwargs)) for n in g.nodes]  # noqa: E731
    return ops(a) == ops(b) and a.outputs == b.outputs and a.mutations == b.mutations


def _in_mode(problem: Problem, mode: str) -> Problem:
    return problem if mode == "any" else problem.in_mode(mode == "train")


def _mode_share(opts: Options, i: int, n: int) -> Options:
    """The options of the i-th of n modes: the problem's budget split between them."""
    if n == 1:
        return opts
    trials = None if opts.budget_trials is None else max(1, (opts.budget_trials + n - 1 - i) // n)
    seconds = None if opts.budget_s is None else opts.budget_s / n
    return replace(opts, budget_trials=trials, budget_s=seconds)


def _generate(problem: Problem, mode: str, policy, device, timed, cache_dir: Path, opts: Options, out_dtypes,
              keys: list[tuple], captured=None):
    """Capture (unless `captured` is the capture already made), rewrite, plan and tune `problem`
    (its models in `mode`): (the generated forward, or None when capture failed, and this mode's
    record for result.json, its plan under "plan"). `keys`: the submodules' training flags the
    forward answers for."""
    record: dict = {"capture": "ok", "groups": []}
    try:
        graph = captured if captured is not None else capture(problem)
        graph, record["rewrites"] = rewrite(graph, policy.name, out_dtypes)
        plan = plan_graph(graph)
    except CaptureError as e:
        opts.log(("" if mode == "any" else f"{mode} mode: ") + f"capture failed: {e}; the original forward runs there")
        record["capture"] = str(e)
        return None, record
    summary, kernels, sources, support = _tune_groups(problem, plan, policy, device, timed, cache_dir, opts, record)
    record["plan"] = plan
    return ModeForward(mode, plan, kernels, sources, summary, support, keys), record


def _not_shipped(record: dict) -> str | None:
    """Why a mode's generated forward must not ship (None: it ships): it failed verification, or it
    timed slower than eager (e.g. ATen's functional batch norm against the module's cuDNN path).
    The failure stays on record (verify_fallback / whole_model_fallback)."""
    if not (record["verify"] or {}).get("passed"):
        record["verify_fallback"] = record["verify"]
        return "the generated forward FAILED verification"
    t = record["timing"] or {}
    kw, eager = (t.get("kernelwright") or {}).get("median_ms"), (t.get("eager") or {}).get("median_ms")
    if kw and eager and kw > eager:
        record["whole_model_fallback"] = {"generated_ms": kw, "eager_ms": eager, "generated_timing": t}
        return f"the generated forward ({kw:.3f} ms) is slower than eager ({eager:.3f} ms)"
    return None


def baseline_output_dtypes(problem: Problem, policy, device) -> list | None:
    """Run eager once on `device` under the policy, before any work: a model that cannot run there
    is a ProblemError, in one line (oneDNN has no bf16 LSTM on the CPU; a model that builds CPU
    index tensors in its forward fails on a GPU; a data-dependent error the meta-device check
    cannot see). Returns the dtypes eager returns under the policy's autocast (bf16), output by
    output; None for the other policies."""
    with eager_under(policy, problem.where, device):
        outs = problem.make_model(device)(*problem.make_inputs(0, device))
    if policy.autocast_dtype is None:
        return None
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    return [o.dtype if isinstance(o, torch.Tensor) else None for o in outs]


def _fuse_gemm_epilogues(plan, graph, env, policy, device, timed, cache_dir, kernels, sources, result, per_trials,
                         per_s, db, problem, log):
    """Strategies 2 and 3 of issue 4: try each (library GEMM, epilogue group) pair as one Triton
    GEMM (a group reducing rows of <= 256, or segments of them, folds the reduction in; a bias +
    ReLU group may also be one cuBLASLt call with that epilogue); it replaces the pair only when
    verified and faster than library GEMM + chosen group."""
    groups = {g.id: g for g in plan.groups}
    for unit in plan.units:
        if unit.node is None or graph.node(unit.node).target not in gemm_epilogue.GEMMS:
            continue
        gemm = graph.node(unit.node)
        users = {u.name for u in graph.users(gemm.name)}
        group = next((g for g in groups.values() if users and users <= set(g.nodes)), None)
        if group is None or gemm_epilogue.fusable(graph, gemm, group):
            continue
        kind = "gemm_epilogue" if group.rdims is None else "gemm_rowreduce"
        gr = GroupResult(f"{group.id}+{gemm.name}", kind, [gemm.op] + [graph.node(n).op for n in group.nodes])
        result["groups"].append(gr)
        try:
            fused = gemm_epilogue.build(graph, gemm, group, plan.groups)
            impls = {g.id: group_impl(graph, g, kernels.get(g.id), cache_dir, sources.get(g.id), device)
                     for g in (group, *fused.prologue)}
            tuner = GemmTuner(graph, fused, impls, env, policy, device, cache_dir, timed)
        except Unsupported as e:
            gr.note = f"no template: {e}"
            continue
        if fused.prologue:
            gr.id = "+".join([g.id for g in fused.prologue] + [gr.id])
            gr.ops = [graph.node(n).op for g in fused.prologue for n in g.nodes] + gr.ops
        gr.eager_excess = tuner.eager_excess
        gr.bytes = sum(_nbytes(graph, v) for v in tuner.unit_inputs + group.outputs)
        if not timed:
            gr.note = "untimed: the library GEMM + epilogue kernel is kept"
            continue
        common = dict(db=db, task_key=f"{problem.name}/{gr.id}/{tuner.task}", task_features=tuner.features,
                      precision=policy.name, device=torch.cuda.get_device_name(device))
        results = _search(tuner, per_trials, per_s, common)
        ok = [r for r in results if r.ok]
        gr.trials, gr.failed, gr.library_ms = len(results), len(results) - len(ok), tuner.library_ms
        best = min(ok, key=lambda r: r.time_ms) if ok else None
        if best is not None and tuner.library_ms is not None and best.time_ms < tuner.library_ms:
            text, ins = tuner.render(best.config)
            gid = f"{group.id}_gemm"
            sources.pop(group.id, None)
            kernels.pop(group.id, None)
            sources[gid] = text
            kernels[group.id] = (gid, ins, list(group.outputs), False)
            kernels[gemm.name] = None  # the fused kernel computes it
            for g in tuner.fused.prologue:  # and the bf16 operand casts, tile by tile
                sources.pop(g.id, None)
                kernels[g.id] = None
            gr.strategy = "triton" if best.config.template.startswith("triton.") else "torch"
            gr.config, gr.time_ms, gr.excess = best.config.as_dict(), best.time_ms, best.excess
            flops = 2 * tuner.fused.M * tuner.fused.N * tuner.fused.K
            gr.note = f"{flops / (best.time_ms * 1e-3) / 1e12:.1f} TFLOP/s"
        else:
            gr.time_ms = tuner.library_ms
            gr.note = "library GEMM + epilogue faster" if best else "no candidate passed"
        log(f"{gr.id} [{kind}]: {gr.strategy} {gr.time_ms or 0:.3f} ms, library+epilogue "
            f"{(tuner.library_ms or 0):.3f} ms ({gr.trials} trials, {gr.failed} failed)")


def _tune_groups(problem, plan: Plan, policy, device, timed, cache_dir, opts: Options, result):
    """Search every group (and every node with a node template); returns summary, kernels, sources."""
    graph = plan.graph
    log = opts.log
    model = problem.make_model(device)
    inputs = problem.make_inputs(0, device)
    with torch.no_grad(), policy.active():
        # the values the tuners read: what crosses a unit's boundary (inputs and outputs of units)
        env = run_graph(graph, model, inputs, keep={v for u in plan.units for v in u.outputs} | set(graph.mutations))
    templates = {u.node: template_for(graph, graph.node(u.node))[0] for u in plan.units if u.group is None}
    units = [u for u in plan.units if u.group is not None or templates[u.node] is not None]
    n = max(1, len(units))
    per_trials = None if opts.budget_trials is None else max(2, opts.budget_trials // n)  # GEMM-epilogue pass
    per_s = None if opts.budget_s is None else max(1.0, opts.budget_s / n)
    # the budget follows the bytes each unit moves per call; a unit computed from the weights alone
    # runs once per weight version (the forward caches it), and a group a node kernel can absorb (the
    # bf16 cast of a model input a depthwise conv reads) runs only if that kernel loses: their first
    # seed, verified and timed
    roots = weight_roots(graph)
    once = {id(u) for u in units if weight_only(graph, u.outputs, roots)} | _absorbable_groups(graph, units, templates)
    hot = [u for u in units if id(u) not in once]
    weights = [_unit_bytes(graph, u) for u in hot]

    def split(total, least):  # unit id -> its budget: 1 (trial or second) each once-unit, shares of the rest
        if not total:
            return {}
        return {**dict.fromkeys(once, type(least)(1)), **dict(zip(map(id, hot), shares(total - len(once), weights, least)))}

    unit_trials, unit_s = split(opts.budget_trials, 2), split(opts.budget_s, 1.0)
    db = TrialDB(default_db_path(opts.db_path), priors=packaged_priors())
    kernels, sources, summary, support = {}, {}, [], {}
    tuned = {id(u) for u in units}
    for unit in plan.units:
        if id(unit) not in tuned:
            summary.append(f"{unit.node}: library ({graph.node(unit.node).target})")
            continue
        extra_tuners, why_none = [], ""
        if unit.group is not None:
            group = unit.group
            gr = GroupResult(group.id, group.kind, [graph.node(x).op for x in group.nodes])
            make = lambda: GroupTuner(graph, group, env, policy, device, cache_dir, timed)  # noqa: E731
            row = cuda_unit.match(graph, group) if timed and opts.backend in ("cuda", "all") else None
            if row is not None:
                extra_tuners.append(lambda: CudaTuner(graph, group, row, env, policy, device, cache_dir, timed))
            if opts.backend == "cuda":  # CUDA C++ candidates only (and the library)
                make, extra_tuners = (extra_tuners[0], []) if extra_tuners else (None, [])
                why_none = ("CUDA C++ candidates run only on a GPU" if not timed else
                            "no CUDA C++ template matches this group (softmax, layer norm, row reductions)")
        else:
            node = graph.node(unit.node)
            template = templates[unit.node]
            if opts.backend == "cuda" and template.name.startswith("triton."):
                template, why_none = None, f"{template.name} is a Triton template (--backend cuda)"
            gr = GroupResult(node.name, "node", [node.op])
            make = None if template is None else (
                lambda: NodeTuner(graph, node, template, env, policy, device, cache_dir, timed))
        result["groups"].append(gr)
        try:
            if make is None:
                raise Unsupported(why_none)
            tuner = make()
        except Unsupported as e:
            gr.note = f"no template: {e}"
            summary.append(f"{gr.id} [{gr.kind}]: library ({gr.note})")
            continue
        gr.eager_excess = tuner.eager_excess
        gr.ops = [graph.node(n).op for n in tuner.nodes]
        # minimum bytes: the unit's inputs and the outputs it produces (max-pool indices often are not)
        gr.bytes = sum(_nbytes(graph, v) for v in tuner.unit_inputs) + sum(
            graph.node(name).outs[idx or 0].nbytes for name, idx in tuner.outputs)
        common = dict(db=db, task_key=f"{problem.name}/{gr.id}/{tuner.task}", task_features=tuner.features,
                      precision=policy.name)
        cfg = None
        if timed:
            common["device"] = torch.cuda.get_device_name(device)
            tuners = [tuner]
            for make_extra in extra_tuners:  # other backends for the same unit, searched alike
                try:
                    tuners.append(make_extra())
                except Unsupported as e:
                    gr.note = f"{gr.note}; {e}".strip("; ")
            found = []  # (result, tuner)
            mine, mine_s = unit_trials.get(id(unit)), unit_s.get(id(unit))
            least = 1 if id(unit) in once else 2
            share = None if mine is None else max(least, round(mine) // len(tuners))  # the unit's budget, split
            for t in tuners:
                results = _search(t, share, None if mine_s is None else mine_s / len(tuners),
                                  {**common, "task_key": f"{common['task_key']}/{t.backend}", "task_features": t.features})
                gr.trials += len(results)
                gr.failed += sum(1 for r in results if not r.ok)
                found += [(r, t) for r in results if r.ok]
            libs = [t.library_ms for t in tuners if t.library_ms is not None]
            gr.library_ms = min(libs) if libs else None
            best, winner = min(found, key=lambda rt: rt[0].time_ms) if found else (None, None)
            if best is not None and (gr.library_ms is None or best.time_ms < gr.library_ms):
                cfg, tuner = best.config, winner
                gr.strategy, gr.config, gr.time_ms, gr.excess = tuner.backend, cfg.as_dict(), best.time_ms, best.excess
            else:
                gr.time_ms = gr.library_ms
                gr.note = "library faster" if best is not None else "no candidate passed"
        elif tuner.backend == "torch":
            gr.note = "a library layout variant is only chosen by measurement (no GPU here)"
        else:
            cfg = _untimed_choice(tuner, db, policy)
            res = tuner.run([cfg])
            gr.trials = 1
            if res and res[0].excess is not None:
                gr.strategy, gr.config, gr.excess = "triton", cfg.as_dict(), res[0].excess
                gr.note = "untimed: heuristic/cost-model choice"
            else:
                gr.failed = 1
                gr.note = f"candidate failed: {res[0].error if res else '?'}"
        if gr.strategy == "cuda":
            support["kw_cuda_runtime"] = runtime_source()
        if gr.strategy != "library":
            text, ins = tuner.render(cfg)
            sources[gr.id] = text
            if unit.group is not None:
                kernels[gr.id] = (gr.id, ins, list(unit.group.outputs), False)
            else:
                kernels[gr.id] = (gr.id, ins, [tuner.result], not tuner.absorbs and len(graph.node(unit.node).outs) > 1)
                for name in tuner.absorbs:
                    kernels[name] = None  # computed inside this unit's kernel
                _drop_absorbed_groups(plan, tuner.absorbs, gr.id, kernels, sources, result)
            mod = tuner.modules.get(cfg.key())
            gr.resources = kernel_resources(mod) if (mod is not None and timed) else {}
            if gr.time_ms:
                gr.gbps = gr.bytes / (gr.time_ms * 1e-3) / 1e9
        ms = f"{gr.time_ms:.3f} ms" if gr.time_ms else "untimed"
        lib = f", library {gr.library_ms:.3f} ms" if gr.library_ms else ""
        log(f"{gr.id} [{gr.kind}] {'+'.join(gr.ops)}: {gr.strategy} {ms}{lib} ({gr.trials} trials, {gr.failed} failed)")
        summary.append(f"{gr.id} [{gr.kind}] {', '.join(gr.ops)}: {gr.strategy}" + (f" {cfg.key()}" if gr.config else ""))
    if opts.backend in ("triton", "all"):
        _fuse_gemm_epilogues(plan, graph, env, policy, device, timed, cache_dir, kernels, sources, result,
                             per_trials, per_s, db, problem, log)
    result["groups"] = [asdict(g) for g in result["groups"]]
    return summary, kernels, sources, support


def _groups_within(units, names) -> list:
    """The group units whose every node is in `names`."""
    names = set(names)
    return [u for u in units if u.group is not None and u.group.nodes and set(u.group.nodes) <= names]


def _absorbable_groups(graph, units, templates) -> set[int]:
    """ids of the group units whose every node some node unit's template (`templates`: node name
    -> its template) may absorb."""
    gone: set[str] = set()
    for u in units:
        if u.node is not None:
            node, template = graph.node(u.node), templates[u.node]
            pattern = absorbed(template, graph, node)
            if pattern:
                gone |= set(pattern[0]) - {u.node}
    return {id(u) for u in _groups_within(units, gone)}


def _drop_absorbed_groups(plan, absorbs, by: str, kernels, sources, result) -> None:
    """Groups whose every node a node kernel computes (the bf16 cast of a model input a depthwise
    conv reads) are not run: no kernel, no source, a note in their report row."""
    for u in _groups_within(plan.units, absorbs):
        kernels[u.name] = None
        sources.pop(u.name, None)
        for gr in result["groups"]:
            if gr.id == u.name:
                gr.strategy, gr.note = "absorbed", f"computed inside {by}'s kernel"


def _unit_bytes(graph, unit) -> int:
    """Bytes a unit reads and writes at least: its inputs and outputs (a node's every output)."""
    if unit.group is not None:
        return sum(_nbytes(graph, v) for v in unit.group.inputs + unit.group.outputs)
    node = graph.node(unit.node)
    return sum(_nbytes(graph, v) for v in node.inputs) + sum(m.nbytes for m in node.outs if m is not None)


def _nbytes(graph, name) -> int:
    outs = [graph.meta(name)] if graph.is_input(name) else graph.node(name).outs
    return sum(m.nbytes for m in outs if m is not None)


def _hung_configs(db, common) -> set[str]:
    """Keys of the configs that hung on this device before (never tried again)."""
    keys = set()
    for r in db.records(task_key=common["task_key"], device=common.get("device"), precision=common.get("precision")):
        try:
            res = record_result(r)
        except (KeyError, TypeError, ValueError):
            continue
        if res.error_kind == watchdog.HANG:
            keys.add(res.config.key())
    return keys


def _search(tuner: KernelTuner, per_trials, per_s, common) -> list[RunResult]:
    """Expert seeds first (in order), then model-based search over the rest of the space; configs
    that hung here before are left out, and one that hangs now is recorded before the process ends."""
    db = common["db"]
    hung = _hung_configs(db, common)
    tuner.on_hang = lambda cfg, msg: db.add_result(RunResult.failure(cfg, watchdog.HANG, msg), common["task_key"],
                                                   common.get("task_features"), common.get("device"),
                                                   common.get("precision"))
    fresh = [c for c in tuner.space if c.key() not in hung]
    if not fresh:
        return []
    space = set(fresh)
    seeds = [c for c in tuner.seeds if c in space] or fresh[:1]
    n_seed = len(seeds) if per_trials is None else min(len(seeds), per_trials)
    first = tune(seeds[:n_seed], tuner.run, budget_trials=n_seed, budget_s=per_s, strategy=Exhaustive(), **common)
    results = list(first.results)
    rest_trials = None if per_trials is None else per_trials - len(results)
    rest_s = None if per_s is None else max(0.0, per_s - first.elapsed_s)
    rest = [c for c in fresh if c not in seeds]
    if rest and (rest_trials is None or rest_trials > 0) and (rest_s is None or rest_s > 0):
        results += tune(rest, tuner.run, budget_trials=rest_trials, budget_s=rest_s, **common).results
    return results


def _untimed_choice(tuner: KernelTuner, db, policy) -> Config:
    """Without a GPU: the cost model's best predicted config if it has data, else the heuristic."""
    try:
        model = CostModel()
        model.fit([r for r in db.records(precision=policy.name, include_priors=True)
                   if r.get("template") == tuner.default.template])
        if model.fitted:
            return model.rank(tuner.space, tuner.features)[0]
    except Exception:  # noqa: BLE001 - a broken db must not stop the job
        pass
    return tuner.default


PROFILE_CALLS = 10  # calls per implementation profiled after timing, for report.md's kernel table


GRAPHS = "kernelwright:graphs"  # the emitted forward replayed as CUDA graphs, timed beside the plain one
PLAIN = "kernelwright:plain"


def pick_forward(timing: dict, gain: float = 0.98, host_share: float = 0.5) -> bool:
    """Choose between the plain forward (timing["kernelwright"]) and its CUDA-graph replay
    (timing[GRAPHS]) in place. The replay wins when it takes under `gain` of the plain time (it
    holds static buffers and captures on first use, so a tie keeps the plain one), or when it is
    not slower and the plain forward is near host-bound: its host issue time is at least
    `host_share` of its time and the replay's is lower. Such a forward's time follows the host's
    speed (bf16 resnet_basic_block, session 11 runs G and C in docs/benchmarks.md: plain 0.375 ms
    with 0.324 of host issue on one machine, 0.921 on a slower one, where the replay took 0.369 and
    0.457), so a tie on a fast host is a loss on a slow one. Afterwards "kernelwright" is the chosen one, PLAIN the plain one
    (in the per-implementation kernel and sync tables too), "cuda_graphs" says which and
    "cuda_graphs_why" why; returns whether the replay won. Without a GRAPHS timing nothing
    changes."""
    if GRAPHS not in timing or "kernelwright" not in timing:
        return False
    timing[PLAIN] = timing.pop("kernelwright")
    for per_impl in (timing.get("kernels_per_call") or {}, timing.get("syncs") or {}):
        if "kernelwright" in per_impl:
            per_impl[PLAIN] = per_impl.pop("kernelwright")
    plain, graphs = timing[PLAIN], timing[GRAPHS]
    issue, graphs_issue = plain.get("issue_ms"), graphs.get("issue_ms")
    if graphs["median_ms"] < gain * plain["median_ms"]:
        timing["cuda_graphs"], timing["cuda_graphs_why"] = True, "faster"
    elif graphs["median_ms"] <= plain["median_ms"] and issue is not None and graphs_issue is not None \
            and issue >= host_share * plain["median_ms"] and graphs_issue < issue:
        timing["cuda_graphs"], timing["cuda_graphs_why"] = True, "host-bound"
    else:
        timing["cuda_graphs"], timing["cuda_graphs_why"] = False, "not faster"
    timing["kernelwright"] = graphs if timing["cuda_graphs"] else plain
    return timing["cuda_graphs"]


def replay_paths(graphs: dict) -> list[dict]:
    """How a CUDA-graph forward ran its captures (`graphs`: model_new's `_kw_graphs_of(module)`),
    one entry per input signature: whether it was captured, and whether its calls copied their
    inputs in (they passed other memory than the capture's) and their outputs out (the caller
    kept a previous result)."""
    return [{"captured": g.graph is not None, "copies_in": g.graph is not None and g.inputs is not None,
             "copies_out": g.graph is not None and g.lend is None} for g in graphs.values()]


def _original_checks(problem, path, policy, device, timed, log, opts):
    """The checks of a module that runs the model's own forward (nothing generated, or a generated
    program not shipped). A KernelBench file's ModelNew is verified and timed as any module; a live
    module's attach() keeps the module's own forward, which verification would only flag for
    calling the reference, so there is nothing to verify or time."""
    if problem.source:
        return _final_checks(problem, path, policy, device, timed, log, compile_mode=opts.compile_mode)
    log("verify: skipped (the module keeps its own forward)")
    return {"passed": True, "skipped": "the module keeps its own forward: nothing generated to verify"}, None


def _final_checks(problem, path, policy, device, timed, log, cuda_graphs=False, compile_mode="default", what=None,
                  memory=None):
    """Verify the emitted module and, on a GPU, time it beside eager and torch.compile (in
    `compile_mode`, which timing["compile_mode"] names; its timing is keyed "compile"). With
    `cuda_graphs`, the same module replaying its forward as CUDA graphs is verified and timed too;
    timing["kernelwright"] is then the faster of the two and timing["cuda_graphs"] says which.
    `what` names the generated forward checked (its mode): a call that ran the original forward
    instead (the module's guard found the call unlike the specialised one) fails the check, so what
    is verified and timed is the generated code. `memory` (a _MemoryPeak) gets the verification's and
    the timing's peaks."""
    from kernelwright.verify import verify

    mod = import_model_new(path)

    def build(reference, graphs=False):
        m = model_new_like(mod, problem, reference, device)
        m._kw_cuda_graphs = graphs
        return m

    v = verify(problem, build, policy, device)
    if what and v.passed and mod._KW_WARNED:
        v.passed, v.failed_check = False, "fallback"
        v.reason = f"the {what} forward ran the original forward for a call with {sorted(mod._KW_WARNED)[0]}"
    if memory is not None:
        memory.mark("verify")
    log((f"{what}: " if what else "") + f"verify: {'PASS' if v.passed else 'FAIL'} excess {v.excess:.3g} (eager {v.eager_excess:.3g}, threshold {v.threshold:.3g})"
        + (f" - {v.reason}" if v.reason else ""))
    timing = None
    if timed and v.passed:
        from kernelwright.measure.baselines import time_problem

        ref = problem.make_model(device)
        cands = {"kernelwright": build(ref)}
        vg = None
        if cuda_graphs and device.type == "cuda":
            vg = verify(problem, lambda reference: build(reference, True), policy, device)
            if vg.passed:
                cands[GRAPHS] = build(ref, True)
            else:
                log(f"CUDA graphs not used: verify failed ({vg.reason})")
        if memory is not None:
            memory.mark("verify")  # (the replayed forward's verification)
        t = time_problem(problem, policy, device, candidates=cands, profile_calls=PROFILE_CALLS,
                         compile_mode=compile_mode)
        if memory is not None:
            memory.mark("timing")
        timing = {k: v.to_json() for k, v in t.items()}
        timing["compile_mode"] = compile_mode
        timing["errors"] = dict(t.errors)
        if t.kernels:
            timing["kernels_per_call"] = {k: [asdict(x) for x in v] for k, v in t.kernels.items()}
        if t.kernels_error:
            timing["errors"]["profile"] = t.kernels_error
        if t.syncs:
            timing["syncs"] = dict(t.syncs)
        parts = [f"{k} {t[k].median_ms:.3f} ms" for k in t]
        log("timing (median): " + ", ".join(parts))
        if GRAPHS in cands:
            timing["replay_paths"] = replay_paths(mod._kw_graphs_of(cands[GRAPHS]))
        if pick_forward(timing):
            v = vg
        if GRAPHS in timing:
            log(f"CUDA graphs {'used' if timing['cuda_graphs'] else 'not used'} ({timing['cuda_graphs_why']}): "
                f"{timing[GRAPHS]['median_ms']:.3f} ms replayed vs {timing[PLAIN]['median_ms']:.3f} ms plain")
        kw = timing.get("kernelwright")
        if kw:
            for base in ("eager", "compile"):
                if base in t:
                    timing[f"speedup_vs_{base}"] = t[base].median_ms / kw["median_ms"]
    elif not timed:
        log("verified on the GPU; nothing was timed (verify only)" if device.type == "cuda" else
            "no CUDA GPU: verified in the Triton interpreter; nothing was timed (timing needs a GPU)")
    return v.to_json(), timing


def _analysis(graph, plan, result) -> dict:
    """Coverage: share of FLOPs and bytes in generated kernels, library calls and fallbacks."""
    if graph is None:
        return {"coverage": None}
    from kernelwright.analyze.classify import anchor

    out = {"anchor": anchor(graph.nodes)}
    try:
        from kernelwright.analyze import analyze, device_spec

        a = analyze(graph, device_spec())
        rows = {r["name"]: r for r in a.to_json()["nodes"]}
    except Exception as e:  # noqa: BLE001
        return {**out, "error": str(e)}
    generated = {n for g in result["groups"] if g["strategy"] in ("triton", "cuda", "absorbed")
                 for n in plan_groups_nodes(plan, g["id"])}
    tot_f = sum(r["flops"] for r in rows.values()) or 1
    tot_b = sum(r["bytes"] for r in rows.values()) or 1
    gen_f = sum(r["flops"] for n, r in rows.items() if n in generated)
    gen_b = sum(r["bytes"] for n, r in rows.items() if n in generated)
    return {**out, "coverage": {"generated_flops": gen_f / tot_f, "generated_bytes": gen_b / tot_b,
                         "library_flops": 1 - gen_f / tot_f, "library_bytes": 1 - gen_b / tot_b},
            "roofline_us": a.to_json().get("totals", {}).get("roofline_us")}


def plan_groups_nodes(plan, gid):
    """Graph nodes a unit id covers: a group id, a node name, or "group+gemm" for a fused GEMM."""
    names = []
    for part in gid.split("+"):
        group = next((g for g in plan.groups if g.id == part), None)
        names += group.nodes if group is not None else [part]
    return names
