"""Dev tool (GPU): where the host time of a CUDA-graph replay call of an emitted forward goes.

Renders PROBLEM's ModelNew with library ops only and graph replay on (the replay path's host work
is the same whatever kernels the graph holds), captures it, then times each part of a call back
to back (no synchronisation inside a batch): the whole call, the signature, the state stamp, the
replay alone; then times the whole call, the replay alone and the plain forward the way
measure.timer does (L2 flush, event pair around one call, a synchronisation per round), with and
without a GPU-side lead that hides the host's issue time (`device_only`), so that the exposed
host latency of a call is the difference of the two; the host time from a call's start to its
replay's issue in those rounds; and prints cProfile's top functions of the whole call.

usage: PYTHONPATH=src python3 scripts/replay_host_probe.py PROBLEM.py [--precision bf16] [--calls 2000]
"""
import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kernelwright.capture import capture
from kernelwright.emit.module import import_model_new, model_new_like, render_model_new, write_module
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("problem")
ap.add_argument("--precision", default="fp32")
ap.add_argument("--calls", type=int, default=2000)
args = ap.parse_args()

prob, policy = load_problem(args.problem), get_policy(args.precision)
plan = plan_graph(rewrite(capture(prob), args.precision)[0])
out = Path(tempfile.mkdtemp())
mod = import_model_new(write_module(out, render_model_new(prob, plan, {}, {}, args.precision, [], None,
                                                          cuda_graphs=True), {}))


def per_call_us(fn, calls=args.calls, batch=50):
    """Median host microseconds of fn() over batches of back-to-back calls."""
    samples = []
    for _ in range(max(1, calls // batch)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(samples)


inputs = prob.make_inputs(0, "cuda")
with torch.no_grad(), policy.active():
    ref = prob.make_model("cuda")
    new = model_new_like(mod, prob, ref, "cuda")
    for _ in range(5):
        new(*inputs)
    torch.cuda.synchronize()
    (entry,) = mod._kw_graphs_of(new).values()
    assert entry.graph is not None, "not captured"
    rows = {
        "whole call (graphs)": lambda: new(*inputs),
        "_kw_signature": lambda: mod._kw_signature(inputs),
        "_kw_switches": mod._kw_switches,
        "_kw_state": new._kw_state,
        "_kw_tensors": new._kw_tensors,
        "graph.replay()": entry.graph.replay,
        "_kw_ptrs": lambda: mod._kw_ptrs(inputs),
        "plain forward": lambda: new._kw_forward(*inputs),
    }
    for name, fn in rows.items():
        print(f"{name:24s} {per_call_us(fn):9.1f} us")
    from kernelwright.measure.l2 import L2Flusher
    from kernelwright.measure.timer import _sleep_cycles_per_ms

    flusher, rate = L2Flusher(), _sleep_cycles_per_ms(torch.device("cuda"))

    def in_rounds(fn, lead_ms=0.0, rounds=60, sync_every=1, marks=None, before=None):
        """(median host issue us, median event-timed us) of fn in the timer's rounds (a
        synchronisation every `sync_every` rounds). With `marks` (perf_counter times fn appends)
        and `before`, each round's last mark minus its start, in us, goes to `before`."""
        issue, events, pending = [], [], []
        for r in range(rounds):
            flusher.flush()
            if lead_ms:
                torch.cuda._sleep(int(rate * lead_ms))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            issue.append((time.perf_counter() - t0) * 1e6)
            if marks:
                before.append((marks.pop() - t0) * 1e6)
            end.record()
            pending.append((start, end))
            if (r + 1) % sync_every == 0 or r == rounds - 1:
                torch.cuda.synchronize()
                events += [a.elapsed_time(b) * 1e3 for a, b in pending]
                pending = []
        return statistics.median(issue[5:]), statistics.median(events[5:])

    print(f"\n{'in the timer rounds':24s} {'issue us':>9s} {'timed us':>9s} {'device us':>9s} {'exposed us':>10s}")
    for name in ("whole call (graphs)", "graph.replay()", "plain forward"):
        issue, timed = in_rounds(rows[name])
        _, device = in_rounds(rows[name], lead_ms=1.0)
        print(f"{name:24s} {issue:9.1f} {timed:9.1f} {device:9.1f} {timed - device:10.1f}")
        issue, timed = in_rounds(rows[name], sync_every=10)
        print(f"{'  (sync every 10 rounds)':24s} {issue:9.1f} {timed:9.1f}")
    if getattr(entry, "replay", None) is not None:  # host time from the call's start to the replay's issue
        real, marks, before = entry.replay, [], []
        entry.replay = lambda: (marks.append(time.perf_counter()), real())[1]
        in_rounds(rows["whole call (graphs)"], marks=marks, before=before)
        entry.replay = real
        if len(before) > 5:
            print(f"{'host us before replay()':24s} {statistics.median(before[5:]):9.1f}  (in the timer rounds)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        new(*inputs)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue())
print(torch.__version__, torch.cuda.get_device_name())
