"""The emitted module's last checks: verified as a whole, then timed beside eager and
torch.compile, and the choice between its plain forward and the same forward replayed as CUDA
graphs (docs/design.md, "Timing protocol")."""
from __future__ import annotations

from dataclasses import asdict

from kernelwright.verify import verify

PROFILE_CALLS = 10  # calls per implementation profiled after timing, for report.md's kernel table


GRAPHS = "kernelwright:graphs"  # the emitted forward replayed as CUDA graphs, timed beside the plain one

PLAIN = "kernelwright:plain"

# The verification record of a live module handed back with its own forward (the Python API's attach()
# keeps it): verification would only flag that forward for calling the reference.
OWN_FORWARD = {"passed": True, "skipped": "the module keeps its own forward: nothing generated to verify"}


def pick_forward(timing: dict, gain: float = 0.98, host_share: float = 0.5) -> bool:
    """Choose between the plain forward (timing["kernelwright"]) and its CUDA-graph replay
    (timing[GRAPHS]) in place. The replay wins when it takes under `gain` of the plain time (it
    holds static buffers and captures on first use, so a tie keeps the plain one), or when it is
    not slower and the plain forward is near host-bound: its host issue time is at least
    `host_share` of its time and the replay's is lower. Such a forward's time follows the host's
    speed (bf16 resnet_basic_block, docs/benchmarks.md "Design choices": plain 0.375 ms with 0.324
    of host issue on one machine, 0.921 on a slower one, where the replay took 0.369 and 0.457), so
    a tie on a fast host is a loss on a slow one. Afterwards "kernelwright" is the chosen one, PLAIN the plain one
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


def graphs_in_every_mode(timings: list[dict | None]) -> bool:
    """Whether the emitted module replays its forwards as CUDA graphs: one module serves every
    training mode, so only when the replay won (pick_forward) in each of `timings` (one per shipped
    generated forward). Otherwise the timings where it won are set back to their plain forward's
    (the one that ships), with the reason."""
    graphed = [t for t in timings if (t or {}).get("cuda_graphs")]
    if timings and len(graphed) == len(timings):
        return True
    for t in graphed:
        t["kernelwright"] = t.get(PLAIN, t["kernelwright"])
        t["cuda_graphs"], t["cuda_graphs_why"] = False, "not faster in every mode"
    return False


def replay_paths(graphs: dict) -> list[dict]:
    """How a CUDA-graph forward ran its captures (`graphs`: model_new's `_kw_graphs_of(module)`),
    one entry per input signature: whether it was captured, and whether its calls copied their
    inputs in (they passed other memory than the capture's) and their outputs out (the caller
    kept a previous result)."""
    return [{"captured": g.graph is not None, "copies_in": g.graph is not None and g.inputs is not None,
             "copies_out": g.graph is not None and any(c is None and not a for c, a in zip(g.lend, g.alias))}
            for g in graphs.values()]


def final_checks(problem, module, build, policy, device, timed, log, cuda_graphs=False, compile_mode="default",
                 what=None, memory=None, stored: dict | None = None, keep=None, also=None):
    """Verify the emitted module and, on a GPU, time it beside eager and torch.compile (in
    `compile_mode`, which timing["compile_mode"] names; its timing is keyed "compile"). With
    `cuda_graphs`, the same module replaying its forward as CUDA graphs is verified and timed too;
    timing["kernelwright"] is then the faster of the two and timing["cuda_graphs"] says which.
    `what` names the generated forward checked (its mode): a call that ran the original forward
    instead (the module's guard found the call unlike the specialised one) fails the check, so what
    is verified and timed is the generated code. `module` is the emitted model_new module and
    `build(reference, graphs)` makes its ModelNew with the reference's weights (replaying CUDA graphs
    when `graphs`). `memory` (a MemoryPeak) gets the verification's and the timing's peaks.
    `stored`: this module's timing from an earlier run (measure/stored.py), reported instead of
    timing again once the module verifies (and its CUDA-graph replay, when that was chosen);
    `keep(timing)` is called with a timing measured here. `also`: the problem in the other training
    mode, where a forward that serves both ("any": no submodule found to depend on the mode) is
    verified too, before any timing: a dependence the search for mode-dependent code missed fails
    there instead of shipping a forward wrong in one mode."""
    mod = module
    v = verify(problem, build, policy, device)
    if what and v.passed and mod._KW_WARNED:
        v.passed, v.failed_check = False, "fallback"
        v.reason = f"the {what} forward ran the original forward for a call with {sorted(mod._KW_WARNED)[0]}"
    if also is not None and v.passed:
        other = verify(also, build, policy, device)
        if not other.passed:
            other.reason = f"in {'train' if also.training else 'eval'} mode too: {other.reason}"
            v = other
    if memory is not None:
        memory.mark("verify")
    log((f"{what}: " if what else "") + f"verify: {'PASS' if v.passed else 'FAIL'} excess {v.excess:.3g} (eager {v.eager_excess:.3g}, threshold {v.threshold:.3g})"
        + (f" - {v.reason}" if v.reason else ""))
    timing = None
    if timed and v.passed and stored is not None:
        if stored.get("cuda_graphs"):
            vg = verify(problem, lambda reference: build(reference, True), policy, device)
            v, stored = (vg, stored) if vg.passed else (v, None)
        if stored is not None:
            log(f"timing: reused, measured {stored['reused']['measured']} for these files on this GPU "
                f"(--retune measures again): kernelwright {stored['kernelwright']['median_ms']:.3f} ms, "
                + ", ".join(f"{k} {stored[k]['median_ms']:.3f} ms" for k in ("eager", "compile") if k in stored))
            return v.to_json(), stored
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
        if keep is not None and kw and not timing["errors"]:
            keep(timing)
    elif not timed:
        log("verified on the GPU; nothing was timed (verify only)" if device.type == "cuda" else
            "no CUDA GPU: verified in the Triton interpreter; nothing was timed (timing needs a GPU)")
    return v.to_json(), timing


def not_shipped(record: dict) -> str | None:
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
