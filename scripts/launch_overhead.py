"""Dev tool (GPU): is a module's forward bound by the CPU issuing its launches or by the GPU?

For eager, torch.compile and an emitted kernelwright module (an optimize output folder), times N
back-to-back calls: the CPU time to issue them (no synchronisation inside) and the wall time until
the GPU has finished. Issue time close to wall time means the CPU is the bottleneck. With
--profile, the emitted module's N calls run under cProfile instead, and the functions with the
most CPU time are printed with the per-call total: where the issue time goes.

usage: PYTHONPATH=src python3 scripts/launch_overhead.py PROBLEM.py OPTIMIZE_OUT_DIR [--precision tf32] [--calls 20]
       PYTHONPATH=src python3 scripts/launch_overhead.py PROBLEM.py OPTIMIZE_OUT_DIR --profile [--calls 200]
       [--top 25] [--sort tottime]
"""
import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.measure.baselines import make_baselines
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("problem")
ap.add_argument("out_dir")
ap.add_argument("--precision", default="fp32")
ap.add_argument("--calls", type=int, default=20)
ap.add_argument("--profile", action="store_true", help="cProfile the emitted module's calls")
ap.add_argument("--top", type=int, default=25, help="with --profile: functions printed")
ap.add_argument("--sort", default="tottime", help="with --profile: pstats key (tottime, cumulative, ...)")
args = ap.parse_args()


def profile(new, inputs):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        new(*inputs)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    print(f"{prob.name} ({args.precision}): {st.total_tt / args.calls * 1e6:.0f} us of CPU per call (under cProfile)")
    st.sort_stats(args.sort).print_stats(args.top)
    print("\n".join(s.getvalue().splitlines()[:args.top + 12]))


prob, policy = load_problem(args.problem), get_policy(args.precision)
inputs = prob.make_inputs(0, "cuda")
with torch.no_grad(), policy.active():
    ref = prob.make_model("cuda")
    new = model_new_like(import_model_new(Path(args.out_dir) / "model_new.py"), prob, ref, "cuda")
    impls = {"kernelwright": new} if args.profile else {**make_baselines(prob, policy, "cuda", inputs=inputs),
                                                         "kernelwright": new}
    if not args.profile:
        print(f"{prob.name} ({args.precision}), {args.calls} calls back to back, per call:")
        print("| impl | CPU issue us | wall us | GPU-bound? |\n|---|---:|---:|---|")
    for name, fn in impls.items():
        for _ in range(10):
            fn(*inputs)
        torch.cuda.synchronize()
        if args.profile:
            profile(fn, inputs)
            continue
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(*inputs)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        issue, wall = (t1 - t0) / args.calls * 1e6, (t2 - t0) / args.calls * 1e6
        print(f"| {name} | {issue:.0f} | {wall:.0f} | {'no: CPU-bound' if issue > 0.8 * wall else 'yes'} |")
