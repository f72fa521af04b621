"""The main job: capture, plan, generate, verify, time and search, then emit ModelNew + report.

Per fusion group, the library path (the group's ATen ops run by PyTorch) is always a candidate,
so a group only runs a generated kernel when that kernel is verified and measured faster. On a
machine without a GPU, kernels run in the Triton interpreter, are verified, nothing is timed,
and the config is the cost model's pick (if it has data) or the documented heuristic.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import CaptureError, capture
from kernelwright.capture.execute import input_device, run_graph, run_node
from kernelwright.codegen.triton_group import Unsupported, _collapse, lower, render_group
from kernelwright.emit.module import import_model_new, render_model_new, write_module
from kernelwright.plan import Plan, plan_graph
from kernelwright.policy import Policy, get_policy
from kernelwright.problem import Problem
from kernelwright.search import CostModel, Exhaustive, RunResult, TrialDB, default_db_path, tune
from kernelwright.space.config import Config
from kernelwright.space.group_space import default_config, group_space, seed_configs
from kernelwright.verify.compare import excess_reason, poisoned_like


@dataclass
class GroupResult:
    id: str
    kind: str
    ops: list[str]
    strategy: str = "library"  # "triton" | "library"
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
    log: Callable[[str], None] = print


def _floating(v):
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _group_reference(graph, group, env, dtype):
    """Run the group's ATen ops on its inputs cast to `dtype`; returns name -> value."""
    local = {k: (env[k].to(dtype) if _floating(env[k]) else env[k]) for k in group.inputs}
    dev = input_device(local)
    for name in group.nodes:
        local[name] = run_node(graph.node(name), local, dev)
    return local


def _time_fns(fns: dict[str, Callable], device) -> dict[str, float]:
    from kernelwright.measure.timer import time_interleaved

    t = time_interleaved(fns, warmup_s=0.05, min_runs=20, max_runs=60, flush=True, device=device)
    return {k: v.median_ms for k, v in t.items()}


def _kernel_resources(mod) -> dict:
    """Registers, spills and shared memory of the compiled Triton kernel, when the GPU compiled one."""
    for obj in vars(mod).values():
        cache = getattr(obj, "device_caches", None) or getattr(obj, "cache", None)
        if not cache:
            continue
        try:
            for dev_cache in (cache.values() if isinstance(cache, dict) else []):
                kernels = dev_cache[0] if isinstance(dev_cache, tuple) else dev_cache
                for k in kernels.values():
                    return {"registers": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None),
                            "shared_bytes": getattr(getattr(k, "metadata", None), "shared", None)}
        except Exception:  # noqa: BLE001 - best effort, Triton internals vary
            return {}
    return {}


class GroupTuner:
    """Builds, verifies and times candidates of one group (a `run` function for search.tune)."""

    def __init__(self, graph, group, env, policy: Policy, device: torch.device, cache_dir: Path, timed: bool):
        self.graph, self.group, self.env, self.policy = graph, group, env, policy
        self.device, self.cache_dir, self.timed = device, cache_dir, timed
        self.low = lower(graph, group)
        self.ref64 = _group_reference(graph, group, env, torch.float64 if device.type != "mps" else torch.float32)
        self.eager = {o: env[o] for o in self.low_outputs}
        self.eager_excess = max((excess_reason(self.eager[o], self.ref64[o], policy.tol, self.eager[o].dtype)[0]
                                 for o in self.low_outputs), default=-math.inf)
        self.threshold = max(policy.tol, 4 * self.eager_excess)
        self.inputs = None
        self.sources: dict[str, str] = {}
        self.modules: dict[str, object] = {}
        self.excesses: dict[str, float] = {}
        self.library_ms: float | None = None

    @property
    def low_outputs(self):
        return list(self.group.outputs)

    def library_fn(self):
        nodes = [self.graph.node(n) for n in self.group.nodes]
        env = self.env
        dev = self.device

        def run():
            local = {k: env[k] for k in self.group.inputs}
            for n in nodes:
                local[n.name] = run_node(n, local, dev)
            return local

        return run

    def build(self, cfg: Config):
        k = render_group(self.graph, self.group, cfg.as_dict(), self.low)
        mod = load_module_from_source(k.source, f"{self.group.id}", self.cache_dir)
        self.sources[cfg.key()] = k.source
        self.modules[cfg.key()] = mod
        return k, mod

    def check(self, cfg: Config, k, mod) -> float:
        """Run once with NaN-poisoned outputs; returns the excess, raising ValueError on failure."""
        args = [self.env[v] for v in k.inputs]
        real_alloc = mod._alloc
        mod._alloc = lambda shape, dtype, device: poisoned_like(torch.empty(shape, dtype=dtype, device=device))
        try:
            with self.policy.active():
                outs = mod.launch(*args)
        finally:
            mod._alloc = real_alloc
        worst = -math.inf
        for name, out in zip(k.outputs, outs):
            ex, why = excess_reason(out, self.ref64[name], self.policy.tol, self.eager[name].dtype)
            if why or ex > self.threshold:
                raise ValueError(f"wrong: {name} excess {ex:.3g} > {self.threshold:.3g}" + (f" ({why})" if why else ""))
            worst = max(worst, ex)
        return worst

    def run(self, configs: list[Config]) -> list[RunResult]:
        results, fns = [], {}
        built = {}
        for cfg in configs:
            try:
                k, mod = self.build(cfg)
            except Unsupported as e:
                results.append(RunResult.failure(cfg, "compile", str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - failures are data
                results.append(RunResult.failure(cfg, "compile", f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            try:
                ex = self.check(cfg, k, mod)
            except ValueError as e:
                results.append(RunResult.failure(cfg, "wrong", str(e)))
                continue
            except Exception as e:  # noqa: BLE001
                results.append(RunResult.failure(cfg, "crash", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"))
                continue
            self.excesses[cfg.key()] = ex
            args = [self.env[v] for v in k.inputs]
            built[cfg.key()] = (cfg, ex)
            fns[cfg.key()] = (lambda m=mod, a=args: m.launch(*a))
        if not self.timed:
            return results + [RunResult(cfg, None, "untimed: no GPU", excess=ex) for cfg, ex in built.values()]
        if fns:
            lib = self.library_fn()
            with self.policy.active():
                times = _time_fns({**fns, "__library__": lib}, self.device)
            lib_ms = times.pop("__library__")
            self.library_ms = lib_ms if self.library_ms is None else min(self.library_ms, lib_ms)
            for key, (cfg, ex) in built.items():
                results.append(RunResult(cfg, times[key], None, excess=ex))
        return results


def _task_features(group, tuner: GroupTuner | None, M: int, R: int) -> dict:
    nbytes = sum(tuner.graph.meta(v).nbytes for v in group.inputs) if tuner else 0
    return {"log2_M": math.log2(max(M, 1)), "log2_R": math.log2(max(R, 1)), "log2_bytes": math.log2(max(nbytes, 1)),
            "n_nodes": len(group.nodes), "n_reduce": sum(1 for s in tuner.low.stmts if s.kind == "reduce") if tuner else 0,
            "kind": group.kind}


def optimize_problem(problem: Problem, out_dir: Path, opts: Options) -> dict:
    """Run the whole job for one problem; writes out_dir and returns result.json's content."""
    policy = get_policy(opts.precision)
    device = torch.device(opts.device)
    timed = device.type == "cuda"
    log = opts.log
    started = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / ".build"
    result: dict = {"problem": problem.name, "path": str(problem.path) if problem.path else None,
                    "precision": policy.name, "device": str(device), "small": opts.small, "groups": [],
                    "capture": "ok"}
    overrides = dict(getattr(problem._module, "SMALL", {}) or {}) if opts.small and problem._module else None
    try:
        graph = capture(problem)
        plan = plan_graph(graph)
    except CaptureError as e:
        log(f"capture failed: {e}; emitting the original model unchanged")
        result["capture"] = str(e)
        graph, plan = None, None
    kernels: dict[str, tuple[str, list[str], list[str]]] = {}
    sources: dict[str, str] = {}
    summary: list[str] = []
    if plan is not None:
        summary, kernels, sources = _tune_groups(problem, plan, policy, device, timed, cache_dir, opts, result)
    text = render_model_new(problem, plan, kernels, sources, policy.name, summary, overrides)
    path = write_module(out_dir, text, sources)
    log(f"wrote {path}")
    result["verify"], result["timing"] = _final_checks(problem, path, policy, device, timed, log)
    result["analysis"] = _analysis(graph, plan, result)
    result["seconds"] = round(time.time() - started, 2)
    (out_dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
    from kernelwright.emit.report import write_report

    write_report(out_dir, result)
    return result


def _tune_groups(problem, plan: Plan, policy, device, timed, cache_dir, opts: Options, result):
    graph = plan.graph
    log = opts.log
    model = problem.make_model(device)
    inputs = problem.make_inputs(0, device)
    with torch.no_grad(), policy.active():
        env = run_graph(graph, model, inputs, keep=True)
    groups = plan.groups
    n = max(1, len(groups))
    per_trials = None if opts.budget_trials is None else max(2, opts.budget_trials // n)
    per_s = None if opts.budget_s is None else max(1.0, opts.budget_s / n)
    db = TrialDB(default_db_path(opts.db_path))
    kernels, sources, summary = {}, {}, []
    for unit in plan.units:
        if unit.group is None:
            summary.append(f"{unit.node}: library ({graph.node(unit.node).target})")
            continue
        group = unit.group
        gr = GroupResult(group.id, group.kind, [graph.node(x).op for x in group.nodes])
        result["groups"].append(gr)
        try:
            tuner = GroupTuner(graph, group, env, policy, device, cache_dir, timed)
        except Unsupported as e:
            gr.note = f"no template: {e}"
            summary.append(f"{group.id} [{group.kind}]: library ({gr.note})")
            continue
        ops = tuner.low.inputs + tuner.low.outputs
        kept, red = _collapse(tuner.low.D, tuner.low.rd, [o.strides for o in ops])
        M = math.prod(s for s, _ in kept) if kept else 1
        R = math.prod(s for s, _ in red) if red else 1
        main = tuner.low.inputs[0] if tuner.low.inputs else None
        r_contig = not red or main is None or any(st[ops.index(main)] == 1 for _, st in red[-1:])
        gr.eager_excess = tuner.eager_excess
        gr.bytes = sum(graph.meta(v).nbytes for v in group.inputs) + sum(graph.meta(v).nbytes for v in group.outputs)
        feats = _task_features(group, tuner, M, R)
        task_key = f"{problem.name}/{group.id}/{'x'.join(map(str, group.domain))}/{group.kind}"
        if timed:
            space = group_space(M, R, group.rdims is None)
            seeds = [c for c in seed_configs(M, R, group.rdims is None, r_contig)]
            common = dict(db=db, task_key=task_key, task_features=feats, device=torch.cuda.get_device_name(device),
                          precision=policy.name)
            n_seed = len(seeds) if per_trials is None else min(len(seeds), per_trials)
            first = tune(seeds[:n_seed], tuner.run, budget_trials=n_seed, budget_s=per_s, strategy=Exhaustive(), **common)
            rest_trials = None if per_trials is None else per_trials - len(first.results)
            rest_s = None if per_s is None else max(0.0, per_s - first.elapsed_s)
            results = list(first.results)
            if rest_trials is None or rest_trials > 0:
                second = tune([c for c in space if c not in seeds], tuner.run, budget_trials=rest_trials,
                              budget_s=rest_s, **common)
                results += second.results
            gr.trials, gr.failed = len(results), sum(1 for r in results if not r.ok)
            gr.library_ms = tuner.library_ms
            ok = [r for r in results if r.ok]
            best = min(ok, key=lambda r: r.time_ms) if ok else None
            if best is not None and (tuner.library_ms is None or best.time_ms < tuner.library_ms):
                cfg = best.config
                gr.strategy, gr.config, gr.time_ms, gr.excess = "triton", cfg.as_dict(), best.time_ms, best.excess
            else:
                gr.time_ms = tuner.library_ms
                gr.note = "library faster" if best is not None else "no candidate passed"
        else:
            cfg = _untimed_choice(group, M, R, r_contig, feats, db, policy)
            res = tuner.run([cfg])
            gr.trials = 1
            if res and res[0].excess is not None:
                gr.strategy, gr.config, gr.excess = "triton", cfg.as_dict(), res[0].excess
                gr.note = "untimed (no GPU): heuristic/cost-model choice"
            else:
                gr.failed = 1
                gr.note = f"candidate failed: {res[0].error if res else '?'}"
        if gr.strategy == "triton":
            key = cfg.key()
            k = render_group(graph, group, gr.config, tuner.low)
            sources[group.id] = k.source
            kernels[group.id] = (group.id, k.inputs, k.outputs)
            mod = tuner.modules.get(key)
            gr.resources = _kernel_resources(mod) if (mod is not None and timed) else {}
            if gr.time_ms:
                gr.gbps = gr.bytes / (gr.time_ms * 1e-3) / 1e9
        ms = f"{gr.time_ms:.3f} ms" if gr.time_ms else "untimed"
        lib = f", library {gr.library_ms:.3f} ms" if gr.library_ms else ""
        log(f"{group.id} [{group.kind}] {'+'.join(gr.ops)}: {gr.strategy} {ms}{lib} ({gr.trials} trials, {gr.failed} failed)")
        summary.append(f"{group.id} [{group.kind}] {', '.join(gr.ops)}: {gr.strategy}"
                       + (f" {cfg.key()}" if gr.config else ""))
    result["groups"] = [asdict(g) for g in result["groups"]]
    return summary, kernels, sources


def _untimed_choice(group, M, R, r_contig, feats, db, policy) -> Config:
    """Without a GPU: the cost model's best predicted config if it has data, else the heuristic."""
    try:
        model = CostModel()
        model.fit(db.records(precision=policy.name))
        if model.fitted:
            space = group_space(M, R, group.rdims is None)
            return model.rank(space, feats)[0]
    except Exception:  # noqa: BLE001 - a broken db must not stop the job
        pass
    return default_config(M, R, group.rdims is None, r_contig)


def _final_checks(problem, path, policy, device, timed, log):
    from kernelwright.verify import verify

    mod = import_model_new(path)

    def factory(reference):
        with torch.device(device):
            m = mod.ModelNew(*problem.get_init_inputs())
        m.load_state_dict(reference.state_dict())
        return m.to(device)

    v = verify(problem, factory, policy, device)
    log(f"verify: {'PASS' if v.passed else 'FAIL'} excess {v.excess:.3g} (eager {v.eager_excess:.3g}, threshold {v.threshold:.3g})"
        + (f" - {v.reason}" if v.reason else ""))
    timing = None
    if timed and v.passed:
        from kernelwright.measure.baselines import time_problem

        ref = problem.make_model(device)
        cand = factory(ref)
        t = time_problem(problem, policy, device, candidates={"kernelwright": cand})
        timing = {k: v.to_json() for k, v in t.items()}
        timing["errors"] = dict(t.errors)
        kw = t.get("kernelwright")
        parts = [f"{k} {t[k].median_ms:.3f} ms" for k in t]
        log("timing (median): " + ", ".join(parts))
        if kw:
            for base in ("eager", "compile"):
                if base in t:
                    timing[f"speedup_vs_{base}"] = t[base].median_ms / kw.median_ms
    elif not timed:
        log("no CUDA GPU: verified in the Triton interpreter; nothing was timed (timing needs a GPU)")
    return v.to_json(), timing


def _analysis(graph, plan, result) -> dict:
    """Coverage: share of FLOPs and bytes in generated kernels, library calls and fallbacks."""
    if graph is None:
        return {"coverage": None}
    try:
        from kernelwright.analyze import analyze, device_spec

        a = analyze(graph, device_spec())
        rows = {r["name"]: r for r in a.to_json()["nodes"]}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    generated = {n for g in result["groups"] if g["strategy"] == "triton" for n in plan_groups_nodes(plan, g["id"])}
    tot_f = sum(r["flops"] for r in rows.values()) or 1
    tot_b = sum(r["bytes"] for r in rows.values()) or 1
    gen_f = sum(r["flops"] for n, r in rows.items() if n in generated)
    gen_b = sum(r["bytes"] for n, r in rows.items() if n in generated)
    return {"coverage": {"generated_flops": gen_f / tot_f, "generated_bytes": gen_b / tot_b,
                         "library_flops": 1 - gen_f / tot_f, "library_bytes": 1 - gen_b / tot_b},
            "roofline_us": a.to_json().get("totals", {}).get("roofline_us")}


def plan_groups_nodes(plan, gid):
    for g in plan.groups:
        if g.id == gid:
            return g.nodes
    return []
