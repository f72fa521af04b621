"""Dev tool (GPU): where the host time of a CUDA-graph replay call of an emitted forward goes.

Renders PROBLEM's ModelNew with library ops only and graph replay on (the replay path's host work
is the same whatever kernels the graph holds), captures it, then times each part of a call back
to back (no synchronisation inside a batch): the whole call, the signature, the state stamp, the
replay alone; and prints cProfile's top functions of the whole call.

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

ap = argparse.ArgumentParser()
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
