"""Persistent RNN kernels (codegen/triton_rnn.py) on a GPU: each searched config (P > 1 programs
per direction) checked against a float64 run of the recurrent ATen op, then the best one timed
against cuDNN (the library call, as eager runs it), the eager model and torch.compile of the model,
with the time per step set against a latency floor.

usage: python3 scripts/rnn_check.py OUT.jsonl [--policies fp32,tf32] [--configs N] [--wave N] [--where SEL] PROBLEM.py ...

--where picks the configs instead: every config of the space whose axes take the values listed,
e.g. `--where WAVE=1,BLOCK_H=16:32,num_warps=4:8,DOT=fma:ieee` (values separated by colons; 1 / 0
for the true / false axes).

One JSON line per result, written as soon as it is known (a config whose programs were not all
resident would spin forever: run this under `timeout`; the lines before it survive):
  {"kind": "config", ...}: a config's first run: its excess over the tolerance, or why it failed
  {"kind": "search", ...}: device time (ms, median, the search's protocol) of every passing config
      and of the library call
  {"kind": "layer", ...}: the best config against cuDNN, the eager model and torch.compile (CUDA
      events, L2 flushed, interleaved rounds, median and mean of >= 50 runs), the time per step,
      and two floors: the same grid running only its barriers (measured), and the matvec's FLOPs
      at the device's peak for the policy
Without a GPU (TRITON_INTERPRET=1, the problems' SMALL sizes with --small) only the config lines
are written.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernelwright.analyze.device import device_spec
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import triton_rnn
from kernelwright.errors import UserError
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem
from kernelwright.search.units import NodeTuner
from kernelwright.space import rnn_space
from kernelwright.space.axes import parse_selection, selected
from kernelwright.space.rnn_space import programs


@triton.jit
def barrier_only_kernel(sync_ptr, STEPS: tl.constexpr, P: tl.constexpr):
    """STEPS grid barriers of P programs per direction (sync_ptr: int32 [D], zero at launch), as
    the RNN kernel runs them between its steps, with nothing else: the synchronisation floor."""
    d = tl.program_id(0) // P
    for s in range(STEPS):
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + d, 1, sem="release", scope="gpu")
        while tl.atomic_add(sync_ptr + d, 0, sem="acquire", scope="gpu") < P * (s + 1):
            pass
        tl.debug_barrier()


def emit(out, **row):
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="JSON lines file, appended to")
    ap.add_argument("problems", nargs="+", help="problem files (KernelBench format) with one recurrent layer")
    ap.add_argument("--policies", default="fp32,tf32", help="comma-separated precision policies")
    ap.add_argument("--configs", type=int, default=4, help="configs per policy: the seeds first, then the space in order")
    ap.add_argument("--wave", type=int, default=0,
                    help="also the N best-ranked wavefront (WAVE) configs of a stack, half with resident weights")
    ap.add_argument("--where", default=None, metavar="SEL",
                    help="every config whose axes take these values (AXIS=V[:V...],...), instead of --configs / --wave")
    ap.add_argument("--small", action="store_true", help="the problems' SMALL sizes (a CPU run in the interpreter)")
    args = ap.parse_args(argv)
    try:
        where = parse_selection(args.where) if args.where else None
    except ValueError as e:
        raise UserError(f"--where: {e}") from None
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    spec = device_spec()
    cache = Path(tempfile.mkdtemp())
    with open(args.out, "a") as out:
        for path in args.problems:
            problem = load_problem(path, small=args.small)
            model = problem.make_model(device)
            inputs = problem.make_inputs(1, device)
            graph = capture(problem)
            node = next((n for n in graph.nodes if n.target in triton_rnn.KINDS), None)
            if node is None:
                raise UserError(f"{path}: no recurrent layer (LSTM / GRU / RNN) in the captured graph")
            with torch.no_grad():
                env = run_graph(graph, model, inputs, keep=True)
            r = triton_rnn._Rnn(graph, node)
            name = Path(path).stem
            compiled = torch.compile(model) if gpu else None
            for pname in args.policies.split(","):
                policy = get_policy(pname)
                with torch.no_grad():
                    tuner = NodeTuner(graph, node, triton_rnn.TEMPLATE, env, policy, device, cache, gpu)
                if where is not None:
                    configs = [c for c in tuner.space if selected(c, where)]
                else:
                    configs = list(dict.fromkeys(tuner.seeds + [c for c in tuner.space if c not in tuner.seeds]))
                    configs = configs[:args.configs]
                    waves = sorted((c for c in tuner.space if c.get("WAVE", False) and c not in configs),
                                   key=rnn_space._rank(r.shape(), pname))  # (the default's order)
                    for resident in (True, False):
                        configs += [c for c in waves if c["RESIDENT"] == resident][:(args.wave + resident) // 2]
                passing = {}
                for cfg in configs:
                    P = programs(r.shape(), cfg["BLOCK_H"])
                    t0 = time.time()
                    try:
                        _, ins, mod = tuner.build(cfg)
                        with torch.no_grad():
                            ex = tuner.check(ins, mod)
                        if gpu:
                            torch.cuda.synchronize()
                        passing[cfg] = (mod, [env[v] for v in ins])
                        emit(out, kind="config", problem=name, policy=pname, config=cfg.as_dict(), P=P, D=r.D,
                             excess=ex, threshold=tuner.threshold, eager_excess=tuner.eager_excess,
                             seconds=round(time.time() - t0, 2))
                    except Exception as e:  # noqa: BLE001 - a failure is a result
                        emit(out, kind="config", problem=name, policy=pname, config=cfg.as_dict(), P=P, D=r.D,
                             error=f"{type(e).__name__}: {str(e)[:300]}")
                if not gpu or not passing:
                    continue
                from kernelwright.measure.timer import time_interleaved

                with torch.no_grad(), policy.active():
                    fns = {cfg.key(): (lambda m=m, a=a: m.launch(*a)) for cfg, (m, a) in passing.items()}
                    times = time_interleaved({**fns, "library": tuner.library_fn()}, warmup_s=0.05, min_runs=20,
                                             max_runs=40, flush=True, device=device, device_only=True)
                emit(out, kind="search", problem=name, policy=pname,
                     ms={k: round(v.median_ms, 4) for k, v in times.items()})
                best = min(passing, key=lambda c: times[c.key()].median_ms)
                mod, a = passing[best]
                P = programs(r.shape(), best["BLOCK_H"])
                sync = torch.zeros(r.D, dtype=torch.int32, device=device)
                steps = r.T * r.layers

                def barriers():
                    sync.zero_()
                    barrier_only_kernel[(r.D * P,)](sync, STEPS=steps, P=P, num_warps=best["num_warps"])

                x = inputs
                with torch.no_grad(), policy.active():
                    compiled(*x)  # compile outside the timed runs
                    t = time_interleaved({"kernelwright": lambda: mod.launch(*a), "cudnn": tuner.library_fn(),
                                          "eager_model": lambda: model(*x), "compile_model": lambda: compiled(*x),
                                          "barriers_only": barriers},
                                         warmup_s=0.2, min_runs=50, max_runs=60, flush=True, device=device)
                flops = 2 * r.B * r.H * r.G * r.H * r.D  # the matvec of one step (both directions)
                peak = spec.peak_tflops("tf32" if best["DOT"] == "tf32" else "bf16" if best["DOT"] == "bf16" else "fp32")
                emit(out, kind="layer", problem=name, policy=pname, config=best.as_dict(), P=P, D=r.D, T=r.T,
                     B=r.B, H=r.H, layers=r.layers, steps=steps,
                     median_ms={k: round(v.median_ms, 4) for k, v in t.items()},
                     mean_ms={k: round(v.mean_ms, 4) for k, v in t.items()}, runs={k: v.runs for k, v in t.items()},
                     us_per_step=round(1000 * t["kernelwright"].median_ms / steps, 3),
                     barrier_us_per_step=round(1000 * t["barriers_only"].median_ms / steps, 3),
                     flop_floor_us_per_step=round(flops / (peak * 1e12) * 1e6, 3),
                     gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:  # a bad problem file or policy name: one line
        print(f"rnn_check.py: {e}", file=sys.stderr)
        sys.exit(2)
