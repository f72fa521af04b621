"""Search a plan: choose an implementation for every unit, then for every GEMM + epilogue pair.

Each unit's choices are the library call (its ATen ops run by PyTorch) and the candidates of
each template that takes it (Triton, CUDA C++, a layout variant), timed alike in interleaved
rounds (search/units.py); a unit runs a generated kernel only when one is verified and measured
faster than the library. A pair (plan.Pair) is searched after its two units: the GEMM's library
call followed by the group's chosen kernel, against GEMM templates with the group as their
epilogue. The budget follows the bytes each unit moves per call (search/budget.py). Without a GPU
nothing is timed: a unit's config is the cost model's pick (when it has data) or the template's
documented default, verified in the Triton interpreter.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from kernelwright import __version__
from kernelwright.analyze.cost import node_flops
from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.capture.execute import run_graph
from kernelwright.capture.export import RECURRENT_INPUT
from kernelwright.codegen import conv_epilogue, cuda_unit, gemm_epilogue, pool_chain
from kernelwright.codegen.cuda_kernels import runtime_source
from kernelwright.codegen.node_kernels import absorbed, template_for, templates_for
from kernelwright.codegen.triton_group import Unsupported
from kernelwright.measure import watchdog
from kernelwright.plan.concat import buffers, placed_slot
from kernelwright.plan.weights import weight_only, weight_roots
from kernelwright.search.budget import shares
from kernelwright.search.cost_model import CostModel
from kernelwright.search.database import TrialDB, default_db_path, packaged_priors, record_result
from kernelwright.search.result import RunResult
from kernelwright.search.strategies import Exhaustive, RandomSearch
from kernelwright.search.tune import tune
from kernelwright.search.units import (ConvTuner, CudaTuner, GemmTuner, GroupTuner, KernelTuner, NodeTuner,
                                      PoolChainTuner, group_impl, kernel_resources, unit_impl)
from kernelwright.space.config import Config


@dataclass
class UnitResult:
    """One row of result.json's "groups": what a unit runs and what its search found."""

    id: str
    kind: str
    ops: list[str]
    strategy: str = "library"  # "triton" | "cuda" (generated kernel) | "torch" (library layout variant) | "library"
    config: dict | None = None
    time_ms: float | None = None  # chosen implementation
    library_ms: float | None = None
    excess: float | None = None
    eager_excess: float | None = None
    bytes: int = 0
    flops: int = 0  # the unit's nodes' FLOPs per call (analyze.cost.node_flops)
    gbps: float | None = None
    trials: int = 0
    failed: int = 0
    note: str = ""
    seconds: float = 0.0  # wall time of this unit's search: candidates built, verified and timed
    resources: dict = field(default_factory=dict)
    # every implementation considered, timed alike: the library call and each template's best
    # verified candidate ({"choice", "time_ms", "trials", "failed"}; time_ms None when untimed or
    # when no candidate of that template passed; "refused": why a choice's template could not take
    # the unit after all)
    choices: list[dict] = field(default_factory=list)


def _choices(results: list[RunResult], library_ms: float | None) -> list[dict]:
    """The rows of UnitResult.choices for a unit whose candidates gave `results`."""
    rows = [{"choice": "library", "time_ms": library_ms, "trials": 0, "failed": 0}]
    for template in dict.fromkeys(r.config.template for r in results):
        mine = [r for r in results if r.config.template == template]
        times = [r.time_ms for r in mine if r.ok and r.time_ms is not None]
        rows.append({"choice": template, "time_ms": min(times) if times else None, "trials": len(mine),
                     "failed": sum(1 for r in mine if r.error is not None and r.error_kind != "untimed")})
    return rows


class Chosen(NamedTuple):
    """What the emitted forward runs for a unit: kernels/<kernel>.py's launch() on graph values
    `inputs`, giving `outputs`; `unpack`: launch returns a node's several outputs as a tuple."""

    kernel: str
    inputs: list[str]
    outputs: list[str]
    unpack: bool = False


@dataclass
class Tuned:
    """A searched plan: `kernels` maps a unit (group id or node name) to its Chosen kernel, or to
    None where another unit's kernel computes it; `sources` the kernel modules' text by name;
    `support` extra files the kernels import; `summary` one line per unit."""

    summary: list[str] = field(default_factory=list)
    kernels: dict[str, Chosen | None] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    support: dict[str, str] = field(default_factory=dict)

    def __iter__(self):  # summary, kernels, sources, support = tune_plan(...)
        return iter((self.summary, self.kernels, self.sources, self.support))


class TrialProgress(NamedTuple):
    """Where one unit's search stands, after each of its trials: `done` trials (results served
    from the candidate cache count) of its `budget` (None: a time budget only), the fastest
    verified time so far (None before one)."""

    unit: str
    done: int
    budget: int | None
    best_ms: float | None


def trial_counter(unit: str, budget: int | None, report: Callable[[TrialProgress], None] | None):
    """`tune`'s `on_result` callback for one unit: counts its trials across every tuner it runs
    and calls `report` with a TrialProgress after each; None when there is no `report`."""
    if report is None:
        return None
    state = {"done": 0, "best": None}

    def on_result(r: RunResult) -> None:
        state["done"] += 1
        if r.ok and r.time_ms is not None and (state["best"] is None or r.time_ms < state["best"]):
            state["best"] = r.time_ms
        report(TrialProgress(unit, state["done"], budget, state["best"]))

    return on_result


@dataclass
class _Job:
    """What every unit's search shares."""

    problem: object
    graph: object
    env: dict
    policy: object
    device: torch.device
    timed: bool
    cache_dir: Path
    backend: str
    db: TrialDB
    log: Callable[[str], None]
    rows: list[UnitResult]
    out: Tuned
    spec: DeviceSpec  # the device the configs are for, read once per job
    no_library: bool = False  # a verified generated kernel is chosen even when the library is faster
    # unit name -> the anchor of the pair whose kernel computes it (two convolutions read by one
    # group, a residual add, make two pairs: the second must not fuse a unit the first already did)
    fused_into: dict = field(default_factory=dict)
    chained: dict = field(default_factory=dict)  # a pool chain's pool -> the units its kernel computes
    reuse: bool = False  # a unit measured before here runs its stored best config alone (search_unit)
    search: str = "model"  # search_unit's order: "model" or "random" (Options.search)
    progress: Callable[[TrialProgress], None] | None = None  # called after every trial (Options.progress)

    def common(self, row: UnitResult, tuner: KernelTuner) -> dict:
        task = dict(db=self.db, task_key=f"{self.problem.name}/{row.id}/{tuner.task}", task_features=tuner.features,
                    precision=self.policy.name, reuse=self.reuse, search=self.search)
        if self.timed:
            task["device"] = torch.cuda.get_device_name(self.device)
        return task


def tune_plan(problem, plan, policy, device, timed: bool, cache_dir: Path, opts, record: dict) -> Tuned:
    """Search every unit of `plan`, then every pair; `opts` gives budget_trials, budget_s, backend
    ("all" | "triton" | "cuda"), db_path, log and progress (called with a TrialProgress after every
    trial). record["groups"] gets one UnitResult row each."""
    graph = plan.graph
    model, inputs = problem.make_model(device), problem.make_inputs(0, device)
    with torch.no_grad(), policy.active():
        # the values the tuners read: what crosses a unit's boundary (inputs and outputs of units), laid
        # out as the emitted forward lays them out
        natural: dict = {}
        env = run_graph(graph, model, inputs, keep={v for u in plan.units for v in u.outputs} | set(graph.mutations),
                        planned_layouts=True, natural=natural)
    job = _Job(problem, graph, env, policy, device, timed, cache_dir, opts.backend,
               TrialDB(default_db_path(opts.db_path), priors=packaged_priors()), opts.log, [], Tuned(), device_spec(),
               bool(getattr(opts, "no_library", False)), reuse=not getattr(opts, "retune", True),
               search=getattr(opts, "search", "model"), progress=getattr(opts, "progress", None))
    templates = {u.node: template_for(graph, graph.node(u.node))[0] for u in plan.units if u.group is None}
    units = [u for u in plan.units if u.group is not None or templates[u.node] is not None or _conv(graph, u.node)]
    trials, seconds, once = _budgets(graph, units, templates, opts)
    tuned = {id(u) for u in units}
    cat_buffers = buffers(graph)
    for unit in plan.units:
        if unit.name in job.out.kernels and job.out.kernels[unit.name] is None:
            continue  # computed inside an earlier unit's kernel (a node template absorbing the nodes after it)
        if id(unit) in tuned:
            _timed_row(job, _tune_unit, job, plan, unit, templates.get(unit.node), trials.get(id(unit)),
                       seconds.get(id(unit)), id(unit) in once)
        elif (slot := placed_slot(graph, unit.node)) is not None or unit.node in cat_buffers:
            where = f"a view of {slot.buffer}'s buffer" if slot is not None else "its own buffer"
            job.out.summary.append(f"{unit.node}: in place ({where}, plan.concat)")
        else:
            job.out.summary.append(f"{unit.node}: library ({graph.node(unit.node).target})")
        # the units after it read this unit's results as the emitted forward will make them: in the
        # planned layout from a shipped kernel, in the library's own where the library runs it
        for v in unit.outputs:
            if v in natural and job.out.kernels.get(unit.name) is None:
                env[v] = natural[v]
            natural.pop(v, None)
    if opts.backend in ("triton", "all"):
        n = max(1, len(units))
        per_trials = None if opts.budget_trials is None else max(2, opts.budget_trials // n)
        per_s = None if opts.budget_s is None else max(1.0, opts.budget_s / n)
        for chain in plan.chains:  # (before the pairs: a convolution computing a whole chain competes with it)
            _timed_row(job, _tune_chain, job, plan, chain, per_trials, per_s)
        for pair in plan.pairs:
            _timed_row(job, _tune_pair, job, plan, pair, per_trials, per_s)
    record["groups"] = [asdict(r) for r in job.rows]
    return job.out


def _timed_row(job: _Job, tune, *args) -> None:
    """tune(*args), its wall seconds recorded on the row it adds (if it adds one)."""
    before, start = len(job.rows), time.perf_counter()
    tune(*args)
    if len(job.rows) > before:
        job.rows[-1].seconds = round(time.perf_counter() - start, 2)


def _budgets(graph, units, templates, opts) -> tuple[dict, dict, set]:
    """(trials by unit id, seconds by unit id, ids of the once-units). The budget follows the bytes
    each unit moves per call; a unit computed from the weights alone, and a group a node kernel can
    absorb (the bf16 cast of a model input a depthwise conv reads, run only if that kernel loses),
    get their first seed, verified and timed."""
    roots = weight_roots(graph)
    once = {id(u) for u in units if weight_only(graph, u.outputs, roots)} | _absorbable_groups(graph, units, templates)
    hot = [u for u in units if id(u) not in once]
    weights = [_unit_bytes(graph, u) for u in hot]

    def split(total, least):
        if not total:
            return {}
        return {**dict.fromkeys(once, type(least)(1)),
                **dict(zip(map(id, hot), shares(total - len(once), weights, least)))}

    return split(opts.budget_trials, 2), split(opts.budget_s, 1.0), once


def _conv(graph, name: str | None) -> bool:
    """Whether node `name` is a convolution the implicit-GEMM template computes."""
    return name is not None and conv_epilogue.conv_supported(graph, graph.node(name)) is None


class Choice(NamedTuple):
    """One generated implementation of a unit, timed like the library call every tuner times
    beside it: `name` says which (the template family), `make` builds its tuner (raising
    Unsupported when the template cannot take this unit after all)."""

    name: str
    make: Callable[[], KernelTuner]


def _unit_choices(job: _Job, plan, unit, template) -> tuple[UnitResult, list[Choice], str]:
    """The unit's report row, its generated choices (the first one's candidates are searched
    first) and, when there are none, why."""
    graph = job.graph
    if unit.group is not None:
        group = unit.group
        row = UnitResult(group.id, group.kind, [graph.node(x).op for x in group.nodes])
        triton = [Choice("triton.group", lambda: GroupTuner(graph, group, job.env, job.policy, job.device,
                                                            job.cache_dir, job.timed))]
        rowop = cuda_unit.match(graph, group) if job.timed and job.backend in ("cuda", "all") else None
        cuda = [] if rowop is None else [Choice("cuda.row", lambda: CudaTuner(
            graph, group, rowop, job.env, job.policy, job.device, job.cache_dir, job.timed))]
        if job.backend != "cuda":
            return row, triton + cuda, ""
        why = ("CUDA C++ candidates run only on a GPU" if not job.timed else
               "no CUDA C++ template matches this group (softmax, layer norm, row reductions)")
        return row, cuda, "" if cuda else why
    node = graph.node(unit.node)
    row = UnitResult(node.name, "node", [node.op])
    others = [t for t in templates_for(graph, node) if t is not template] if template is not None else []
    choices = [Choice(t.name, lambda t=t: NodeTuner(graph, node, t, job.env, job.policy, job.device, job.cache_dir,
                                                    job.timed, _absorbed_impls(job, plan, t, node)))
               for t in ([template] if template else []) + others if _absorbs_whole_units(plan, graph, t, node)]
    if job.backend == "cuda":
        if template is None or template.name.startswith("triton."):
            return row, [], "the node's templates are Triton templates (--backend cuda)"
        return row, choices, ""
    if _conv(graph, node.name):  # the implicit-GEMM convolution, its bias fused
        def conv_tuner():
            fused = conv_epilogue.build(graph, node, None, plan.groups, prologue_groups=_prologue_groups(plan, node.name))
            # (what it replaces: the absorbed units' chosen kernels, then the library convolution)
            impls = [_unit_impl(job, plan, u) for u in (*fused.absorbed, node.name)] if fused.absorbed else None
            return ConvTuner(graph, fused, impls, job.env, job.policy, job.device, job.cache_dir, job.timed, job.spec)
        choices.append(Choice("triton.conv", conv_tuner))
    return row, choices, ""


def _tune_unit(job: _Job, plan, unit, template, trials, seconds, once: bool) -> None:
    graph = job.graph
    row, choices, why_none = _unit_choices(job, plan, unit, template)
    job.rows.append(row)
    try:
        if not choices:
            raise Unsupported(why_none)
        if not job.timed and job.no_library and len(choices) > 1:
            # a generated kernel first (not a library variant): only the first runs untimed
            choices = sorted(choices, key=lambda c: c.name.startswith("torch."))
        tuner = choices[0].make()
    except Unsupported as e:
        row.note = f"no template: {e}"
        job.out.summary.append(f"{row.id} [{row.kind}]: library ({row.note})")
        return
    row.eager_excess = tuner.eager_excess
    row.ops = [graph.node(n).op for n in tuner.nodes]
    # minimum bytes: the unit's inputs and the outputs it produces (max-pool indices often are not)
    row.bytes = sum(_nbytes(graph, v) for v in tuner.unit_inputs) + sum(
        graph.node(name).outs[idx or 0].nbytes for name, idx in tuner.outputs)
    row.flops = _flops(graph, tuner.nodes)
    if job.timed:
        cfg, tuner = _timed_choice(job, row, [tuner], choices[1:], trials, seconds, 1 if once else 2)
    elif tuner.backend == "torch":
        cfg, row.note = None, "a library layout variant is only chosen by measurement (no GPU here)"
    elif isinstance(tuner, ConvTuner) and not job.no_library:
        # the library convolution is a strong default: a generated one ships measured (or with no_library)
        cfg, row.note = None, "a generated convolution is only chosen by measurement (no GPU here) or with no_library"
    else:
        cfg = _untimed_choice(job, row, tuner)
    steps = recurrent_steps(graph, tuner.nodes, row.config if row.strategy != "library" else None)
    if steps and row.time_ms:  # a recurrent layer: the latency of each dependent step
        row.note = "; ".join(x for x in (row.note, f"{row.time_ms * 1e3 / steps:.2f} us per dependent step "
                                                    f"({steps})") if x)
    if row.strategy != "library":
        _ship(job, plan, unit, row, tuner, cfg)
    ms = f"{row.time_ms:.3f} ms" if row.time_ms else "untimed"
    lib = f", library {row.library_ms:.3f} ms" if row.library_ms else ""
    job.log(f"{row.id} [{row.kind}] {'+'.join(row.ops)}: {row.strategy} {ms}{lib} ({row.trials} trials, "
            f"{row.failed} failed)")
    job.out.summary.append(f"{row.id} [{row.kind}] {', '.join(row.ops)}: {row.strategy}"
                           + (f" {cfg.key()}" if row.config else ""))


def recurrent_steps(graph, nodes: list[str], config: dict | None) -> int | None:
    """The dependent steps of a recurrent unit (an LSTM / GRU / RNN op over a padded sequence):
    time steps x layers, or time steps + layers - 1 for a generated stack run as a wavefront
    (config WAVE); the directions run side by side. None for other units."""
    for name in nodes:
        n = graph.node(name)
        if n.target in RECURRENT_INPUT:
            x = graph.meta(n.args[0].name)
            layers, batch_first = int(n.args[4]), bool(n.args[8])
            steps = x.shape[1] if batch_first and len(x.shape) == 3 else x.shape[0]
            return steps + layers - 1 if (config or {}).get("WAVE") else steps * layers
    return None


def _timed_choice(job: _Job, row: UnitResult, tuners: list, more: list[Choice], trials, seconds, least: int):
    """Search each choice's tuner with its share of the unit's budget; the fastest verified
    candidate wins when it beats the library. Returns (config or None, the winning tuner)."""
    refused = []
    for choice in more:  # the unit's other generated choices, searched alike
        try:
            tuners.append(choice.make())
        except Unsupported as e:
            row.note = f"{row.note}; {e}".strip("; ")
            refused.append({"choice": choice.name, "time_ms": None, "trials": 0, "failed": 0, "refused": str(e)})
    found, every = [], []  # (result, tuner) of the verified candidates; every result
    share = None if trials is None else max(least, round(trials) // len(tuners))
    common = job.common(row, tuners[0])  # (the first tuner's task names the unit's records)
    common["on_result"] = trial_counter(row.id, None if trials is None else round(trials), job.progress)
    for t in tuners:
        results = search_unit(t, share, None if seconds is None else seconds / len(tuners),
                              {**common, "task_key": f"{common['task_key']}/{t.backend}", "task_features": t.features})
        row.trials += len(results)
        row.failed += sum(1 for r in results if not r.ok)
        found += [(r, t) for r in results if r.ok]
        every += results
    libs = [t.library_ms for t in tuners if t.library_ms is not None]
    row.library_ms = min(libs) if libs else None
    row.choices = _choices(every, row.library_ms) + refused
    generated = [(r, t) for r, t in found if t.backend != "torch"]
    if job.no_library and generated:  # every unit with a generated strategy uses it
        found = generated
    best, winner = min(found, key=lambda rt: rt[0].time_ms) if found else (None, tuners[0])
    if best is not None and (row.library_ms is None or best.time_ms < row.library_ms or job.no_library):
        row.strategy, row.config, row.time_ms, row.excess = winner.backend, best.config.as_dict(), best.time_ms, best.excess
        return best.config, winner
    row.time_ms = row.library_ms
    row.note = "library faster" if best is not None else "no candidate passed"
    return None, tuners[0]


def _untimed_choice(job: _Job, row: UnitResult, tuner: KernelTuner):
    """Without a GPU: the cost model's (or the template's default) config, verified once."""
    cfg = untimed_choice(tuner, job.db, job.policy)
    res = tuner.run([cfg])
    row.trials = 1
    count = trial_counter(row.id, 1, job.progress)
    for r in res if count is not None else ():
        count(r)
    row.choices = _choices(res, None)
    if res and res[0].excess is not None:
        row.strategy, row.config, row.excess = "triton", cfg.as_dict(), res[0].excess
        row.note = "untimed: heuristic/cost-model choice"
    else:
        row.failed = 1
        row.note = f"candidate failed: {res[0].error if res else '?'}"
    return cfg


def _ship(job: _Job, plan, unit, row: UnitResult, tuner: KernelTuner, cfg: Config) -> None:
    """Record the unit's chosen kernel (its source, what it reads and writes) for the emitter."""
    graph, out = job.graph, job.out
    if row.strategy == "cuda":
        out.support["kw_cuda_runtime"] = runtime_source()
    text, ins = tuner.render(cfg)
    out.sources[row.id] = text
    if unit.group is not None:
        out.kernels[row.id] = Chosen(row.id, ins, list(unit.group.outputs))
    else:
        out.kernels[row.id] = Chosen(row.id, ins, [tuner.result],
                                     not tuner.absorbs and len(graph.node(unit.node).outs) > 1)
        for name in tuner.absorbs:
            out.kernels[name] = None  # computed inside this unit's kernel
            out.sources.pop(name, None)
        _drop_absorbed_groups(plan, tuner.absorbs, row.id, out, job.rows)
    mod = tuner.modules.get(cfg.key())
    row.resources = kernel_resources(mod) if (mod is not None and job.timed) else {}
    if row.time_ms:
        row.gbps = row.bytes / (row.time_ms * 1e-3) / 1e9


def _tune_pair(job: _Job, plan, pair, per_trials, per_s) -> None:
    """A GEMM or convolution and its epilogue group as one kernel: a Triton GEMM (a group
    reducing rows of <= 256, or segments of them, folds the reduction in; a bias + ReLU group may
    also be one cuBLASLt call with that epilogue) or a Triton implicit-GEMM convolution. It
    replaces the two only when verified and faster than the node's and the group's chosen
    implementations run one after the other (with no_library: whenever one is verified)."""
    graph, out = job.graph, job.out
    node, group = graph.node(pair.anchor), pair.group
    if (gemm_epilogue.fusable(graph, node, group) if pair.kind == "gemm"
            else conv_epilogue.fusable(graph, node, group, pair.pools, pair.post)):
        return
    for owner in {job.fused_into.get(u, pair.anchor) for u in pair.units} - {pair.anchor}:
        if owner not in job.chained or not job.chained[owner] <= set(pair.units):
            return  # another kernel computes one of its units (and reads this anchor's result)
    kind = ("conv_pool" if pair.pools else "conv_epilogue") if pair.kind == "conv" \
        else "gemm_epilogue" if group.rdims is None else "gemm_rowreduce"
    row = UnitResult(pair.name, kind, [graph.node(n).op for u in pair.units for n in _unit_nodes(plan, u)])
    job.rows.append(row)
    try:
        if pair.kind == "gemm":
            fused = gemm_epilogue.build(graph, node, group, plan.groups)
            impls = {g.id: group_impl(graph, g, out.kernels.get(g.id), job.cache_dir, out.sources.get(g.id),
                                      job.device) for g in (group, *fused.prologue)}
            tuner = GemmTuner(graph, fused, impls, job.env, job.policy, job.device, job.cache_dir, job.timed)
            absorbed = [g.id for g in fused.prologue]  # the bf16 operand casts, tile by tile
        else:
            fused = conv_epilogue.build(graph, node, group, plan.groups, pair.pools, pair.post,
                                        prologue_groups=_prologue_groups(plan, pair.anchor))
            absorbed = list(fused.absorbed)
            impls = [_unit_impl(job, plan, u) for u in absorbed + pair.units]
            tuner = ConvTuner(graph, fused, impls, job.env, job.policy, job.device, job.cache_dir, job.timed, job.spec)
    except Unsupported as e:
        row.note = f"no template: {e}"
        return
    taken = {job.fused_into[u] for u in absorbed if u in job.fused_into} - {pair.anchor}
    if any(owner not in job.chained or not job.chained[owner] <= set(pair.units) for owner in taken):
        # a group the kernel would take in (a bf16 cast after a pool) is computed inside another
        # kernel (that pool's chain), which does not write the value the group reads
        row.note = f"{', '.join(absorbed)}: computed inside {', '.join(sorted(taken))} already"
        return
    if absorbed:
        row.id = "+".join(absorbed + [row.id])
        row.ops = [graph.node(n).op for u in absorbed for n in _unit_nodes(plan, u)] + row.ops
    row.eager_excess = tuner.eager_excess
    last = pair.units[-1]  # the unit whose result the pair produces
    outputs = list(group.outputs) if pair.kind == "gemm" else fused.outputs
    row.bytes = sum(_nbytes(graph, v) for v in tuner.unit_inputs + outputs)
    row.flops = _flops(graph, tuner.nodes)
    if not job.timed and not job.no_library:
        row.note = "untimed: the library node + epilogue kernel is kept"
        return
    M, N, K = (fused.M, fused.N, fused.K) if pair.kind == "gemm" else fused.gemm
    flops = 2 * M * N * K * (int(node.args[8]) if pair.kind == "conv" else 1)
    best = _search_fused(job, row, tuner, per_trials, per_s, pair.units + absorbed, last, outputs,
                         f"{last}_{pair.kind}", pair.anchor)
    if best is not None:
        row.note = f"{flops / (best.time_ms * 1e-3) / 1e12:.1f} TFLOP/s" if best.time_ms else "untimed: --no-library"
    elif row.trials > row.failed:
        row.note = f"{'library' if pair.kind == 'gemm' else 'chosen'} {pair.kind} + epilogue faster"
    job.log(f"{row.id} [{kind}]: {row.strategy} {row.time_ms or 0:.3f} ms, {pair.kind} + epilogue "
            f"{(tuner.library_ms or 0):.3f} ms ({row.trials} trials, {row.failed} failed)")


def _tune_chain(job: _Job, plan, chain, per_trials, per_s) -> None:
    """A pool and its pointwise neighbours (plan.PoolChain) as one pool kernel; it replaces the
    units' chosen implementations only when verified and faster than they are one after the
    other (with no_library: whenever it verifies)."""
    graph = job.graph
    if chain.post is not None and _absorbed_unit(job, chain.post.id):  # (a cast the next convolution computes)
        chain = dataclasses.replace(chain, post=None, out_of=())
    if chain.pre is not None and _absorbed_unit(job, chain.pre.id):
        chain = dataclasses.replace(chain, pre=None, into=())
    if (chain.pre is None and chain.post is None) or any(u in job.fused_into for u in chain.units):
        return  # another kernel computes one of its units (the group between two pools)
    row = UnitResult(chain.name, "pool_chain", [graph.node(n).op for u in chain.units for n in _unit_nodes(plan, u)])
    job.rows.append(row)
    try:
        kernel = pool_chain.build(graph, chain)
        impls = [_unit_impl(job, plan, u) for u in chain.units]
        tuner = PoolChainTuner(graph, kernel, impls, job.env, job.policy, job.device, job.cache_dir, job.timed,
                               job.spec)
    except Unsupported as e:
        row.note = f"no template: {e}"
        return
    row.eager_excess = tuner.eager_excess
    row.bytes = sum(_nbytes(graph, v) for v in tuner.unit_inputs + [chain.out])
    row.flops = _flops(graph, tuner.nodes)
    if not job.timed and not job.no_library:
        row.note = "untimed: the units' own kernels are kept"
        return
    best = _search_fused(job, row, tuner, per_trials, per_s, chain.units, chain.units[-1], [chain.out],
                         f"{chain.units[-1]}_chain", chain.pool)
    if best is not None:
        job.chained[chain.pool] = set(chain.units)
        row.note = "untimed: --no-library" if best.time_ms is None else ""
    elif row.trials > row.failed:
        row.note = "the units' own kernels faster"
    job.log(f"{row.id} [pool_chain]: {row.strategy} {row.time_ms or 0:.3f} ms, units one after the other "
            f"{(tuner.library_ms or 0):.3f} ms ({row.trials} trials, {row.failed} failed)")


def _search_fused(job: _Job, row: UnitResult, tuner: KernelTuner, per_trials, per_s, units: list[str], last: str,
                  outputs: list[str], name: str, owner: str) -> RunResult | None:
    """Search `tuner`, whose kernel computes the plan units `units` (the result of `last`), and
    install its best candidate as kernel `name` in place of those units' when it is verified and
    faster than their implementations one after the other (with no_library: when a generated one
    verifies; without a GPU: the first config, verified). Fills `row`; returns the installed
    result or None."""
    out = job.out
    if job.timed:
        results = search_unit(tuner, per_trials, per_s, {**job.common(row, tuner),
                                                         "on_result": trial_counter(row.id, per_trials, job.progress)})
        ok = [r for r in results if r.ok]
    else:  # no_library without a GPU: the first config, verified
        results = tuner.run([untimed_choice(tuner, job.db, job.policy)])
        ok = [r for r in results if r.excess is not None]
    row.trials, row.failed, row.library_ms = len(results), len(results) - len(ok), tuner.library_ms
    row.choices = _choices(results, tuner.library_ms)
    generated = [r for r in ok if r.config.template.startswith("triton.")]
    if job.no_library and generated:
        best = min(generated, key=lambda r: r.time_ms if r.time_ms is not None else 0.0)
    else:
        best = min(ok, key=lambda r: r.time_ms) if ok else None
        if best is not None and (tuner.library_ms is None or best.time_ms >= tuner.library_ms):
            best = None
    if best is None:
        row.time_ms = tuner.library_ms
        if not ok:
            row.note = "no candidate passed"
        return None
    text, ins = tuner.render(best.config)
    for u in units:
        chosen = out.kernels.get(u)
        out.sources.pop(u, None)
        if chosen is not None:
            out.sources.pop(chosen.kernel, None)
        out.kernels[u] = None  # the fused kernel computes them
        job.fused_into[u] = owner
    out.sources[name] = text
    out.kernels[last] = Chosen(name, ins, outputs)
    row.strategy = "triton" if best.config.template.startswith("triton.") else "torch"
    row.config, row.time_ms, row.excess = best.config.as_dict(), best.time_ms, best.excess
    # the module's header: the units as fused, then the kernel computing them
    _computed_inside(out.summary, units, "fused", row.id)
    out.summary.append(f"{row.id} [{row.kind}] {', '.join(row.ops)}: {row.strategy} {best.config.key()}")
    return best


def _flops(graph, nodes) -> int:
    """FLOPs per call of the graph nodes `nodes`."""
    return sum(node_flops(graph.node(n), graph) for n in nodes)


def _absorbs_whole_units(plan, graph, template, node) -> bool:
    """Whether every unit holding a node the template's kernel would compute with `node` (its
    ``absorbed`` pattern) holds nothing else: a unit left running would read values the kernel
    no longer writes."""
    pattern = absorbed(template, graph, node)
    nodes = set(pattern[0]) if pattern else set()
    return all(set(u.nodes) <= nodes for u in plan.units if set(u.nodes) & nodes)


def _absorbed_impls(job: _Job, plan, template, node) -> list | None:
    """What the program runs for the nodes a node template's kernel would compute with `node`
    (its ``absorbed`` pattern): the chosen implementations of the units holding them, in plan
    order (`node`'s own unit, its ATen op, last); None when the template absorbs nothing."""
    pattern = absorbed(template, job.graph, node)
    if not pattern:
        return None
    nodes = set(pattern[0])
    return [_unit_impl(job, plan, u.name) for u in plan.units if set(u.nodes) & nodes]


def _unit_nodes(plan, name: str) -> list[str]:
    unit = next(u for u in plan.units if u.name == name)
    return unit.nodes


def _unit_impl(job: _Job, plan, name: str):
    """The chosen implementation of the plan unit `name` as env -> env: its kernel, nothing when
    another unit's kernel computes it, else its ATen ops."""
    if name in job.out.kernels and job.out.kernels[name] is None:
        return lambda local: local
    kernel = job.out.kernels.get(name)  # (a fused pair's kernel is named apart from the unit holding it)
    return unit_impl(job.graph, _unit_nodes(plan, name), kernel, job.cache_dir,
                     job.out.sources.get(kernel.kernel) if kernel is not None else None, job.device, name)


def _prologue_groups(plan, anchor: str) -> list:
    """The plan's groups the convolution `anchor` may apply as the prologue of its loads: those no
    other pair or pool chain may fuse (a group after a convolution is that convolution's epilogue
    first), so that no two kernels each compute a group whose input the other no longer writes."""
    taken = {u for p in plan.pairs if p.anchor != anchor for u in p.units} | {u for c in plan.chains for u in c.units}
    return [g for g in plan.groups if g.id not in taken]


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
            pattern = absorbed(templates[u.node], graph, graph.node(u.node))
            if pattern:
                gone |= set(pattern[0]) - {u.node}
    return {id(u) for u in _groups_within(units, gone)}


def _absorbed_unit(job: _Job, unit: str) -> bool:
    """Whether a node's kernel computes the group `unit` inside itself (`_drop_absorbed_groups`; a
    fused kernel's units are in job.fused_into instead)."""
    return unit in job.out.kernels and job.out.kernels[unit] is None and unit not in job.fused_into


def _drop_absorbed_groups(plan, absorbs, by: str, out: Tuned, rows: list[UnitResult]) -> None:
    """Groups whose every node a node kernel computes (the bf16 cast of a model input a depthwise
    conv reads, the batch norm and activation a convolution's prologue applies) and node units it
    computes (a layout copy) are not run: no kernel, no source, a note in their report row."""
    names = [u.name for u in _groups_within(plan.units, absorbs)] + [n for n in absorbs if n != by]
    for name in names:
        out.kernels[name] = None
        out.sources.pop(name, None)
        for row in rows:
            if row.id == name:
                row.strategy, row.note = "absorbed", f"computed inside {by}'s kernel"
    _computed_inside(out.summary, names, "absorbed", by)


def _computed_inside(summary: list[str], names, how: str, by: str) -> None:
    """The module header's lines of the units `names` say, in place, that `by`'s kernel computes
    them (`how`: "fused", "absorbed")."""
    starts = tuple(f"{name}{sep}" for name in names for sep in (" [", ": "))
    summary[:] = [f"{line.split(': ', 1)[0]}: {how} (computed inside {by}'s kernel)" if line.startswith(starts)
                  else line for line in summary]


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
    """Keys of the configs that hung or faulted the GPU on this device before (never tried again)."""
    keys = set()
    for r in db.records(task_key=common["task_key"], device=common.get("device"), precision=common.get("precision")):
        try:
            res = record_result(r)
        except (KeyError, TypeError, ValueError):
            continue
        if res.error_kind in watchdog.NEVER_AGAIN:
            keys.add(res.config.key())
    return keys


def stored_best(db, common, space) -> Config | None:
    """The fastest config of `space` that this task measured before on this device, precision and
    kernelwright version (verified then: no error), from the user's database only (never the
    packaged priors); None without one."""
    keys = {c.key(): c for c in space}
    best, best_ms = None, None
    for r in db.records(task_key=common["task_key"], device=common.get("device"), precision=common.get("precision"),
                        ok_only=True):
        if r.get("version") != __version__:
            continue
        try:
            res = record_result(r)
        except (KeyError, TypeError, ValueError):
            continue
        cfg = keys.get(res.config.key())
        if cfg is not None and res.ok and (best_ms is None or res.time_ms < best_ms):
            best, best_ms = cfg, res.time_ms
    return best


def search_unit(tuner: KernelTuner, per_trials, per_s, common) -> list[RunResult]:
    """Expert seeds first (in order), then model-based search over the rest of the space; configs
    that hung here before are left out, and one that hangs now is recorded before the process ends.
    With common["reuse"] a unit this device measured before (`stored_best`) runs its fastest
    stored config alone, verified and timed again; the search runs only if that one fails now.
    With common["search"] == "random" the configs after the seeds run in a uniformly random order
    (seed 0) instead, and each seed's result records its rank among the seeds (`extra["seed_rank"]`):
    a sample of the space for search studies, whose replays start where the shipped search does."""
    db = common["db"]
    hung = _hung_configs(db, common)
    tuner.on_hang = lambda cfg, msg, kind=watchdog.HANG: db.add_result(
        RunResult.failure(cfg, kind, msg), common["task_key"], common.get("task_features"), common.get("device"),
        common.get("precision"))
    fresh = [c for c in tuner.space if c.key() not in hung]
    if not fresh:
        return []
    common = dict(common)
    reuse = common.pop("reuse", False)
    sample = common.pop("search", "model") == "random"
    if not sample and reuse and (known := stored_best(db, common, fresh)) is not None:
        again = tune([known], tuner.run, budget_trials=1, strategy=Exhaustive(), **common).results
        if any(r.ok for r in again):
            return list(again)
    run = _seed_ranks(tuner) if sample else tuner.run
    space = set(fresh)
    seeds = [c for c in tuner.seeds if c in space] or ([] if sample else fresh[:1])
    n_seed = len(seeds) if per_trials is None else min(len(seeds), per_trials)
    first = tune(seeds[:n_seed], run, budget_trials=n_seed, budget_s=per_s, strategy=Exhaustive(), **common)
    results = list(first.results)
    rest_trials = None if per_trials is None else per_trials - len(results)
    rest_s = None if per_s is None else max(0.0, per_s - first.elapsed_s)
    rest = [c for c in fresh if c not in seeds]
    if rest and (rest_trials is None or rest_trials > 0) and (rest_s is None or rest_s > 0):
        results += tune(rest, run, budget_trials=rest_trials, budget_s=rest_s,
                        strategy=RandomSearch(seed=0) if sample else None, **common).results
    return results


def _seed_ranks(tuner: KernelTuner):
    """tuner.run, each seed's result marked with its rank among the tuner's seeds."""
    rank = {c: i for i, c in enumerate(tuner.seeds)}

    def run(batch):
        results = tuner.run(batch)
        for r in results:
            if r.config in rank:
                r.extra["seed_rank"] = rank[r.config]
        return results
    return run


_FITTED: dict[tuple, CostModel | None] = {}  # (db file and its state, precision, template) -> fitted model


def _db_state(db) -> tuple:
    return db.state(), tuple(map(str, db.priors))


def untimed_choice(tuner: KernelTuner, db, policy) -> Config:
    """Without a GPU: the cost model's best predicted config if it has data, else the default.
    The model is fitted once per state of the database, precision and template (a plan has many
    units of one template)."""
    try:
        key = (_db_state(db), policy.name, tuner.default.template)
        if key not in _FITTED:
            model = CostModel()
            model.fit([r for r in db.records(precision=policy.name, include_priors=True)
                       if r.get("template") == tuner.default.template])
            _FITTED[key] = model if model.fitted else None
        if _FITTED[key] is not None:
            return _FITTED[key].rank(tuner.space, tuner.features)[0]
    except Exception:  # noqa: BLE001 - a broken db must not stop the job
        pass
    return tuner.default
