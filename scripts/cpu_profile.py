"""Dev tool (GPU): where the CPU time of an emitted module's forward goes (cProfile).

Runs N calls of ModelNew from an optimize output folder back to back (no synchronisation inside)
under cProfile and prints the functions with the most own time, and the per-call total.

usage: PYTHONPATH=src python3 scripts/cpu_profile.py PROBLEM.py OPTIMIZE_OUT_DIR [--precision bf16] [--calls 200]
"""
import argparse
import cProfile
import io
import pstats
from pathlib import Path

import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("problem")
ap.add_argument("out_dir")
ap.add_argument("--precision", default="fp32")
ap.add_argument("--calls", type=int, default=200)
ap.add_argument("--top", type=int, default=25)
ap.add_argument("--sort", default="tottime", help="pstats key: tottime, cumulative, ...")
args = ap.parse_args()

prob, policy = load_problem(args.problem), get_policy(args.precision)
inputs = prob.make_inputs(0, "cuda")
with torch.no_grad(), policy.active():
    ref = prob.make_model("cuda")
    new = model_new_like(import_model_new(Path(args.out_dir) / "model_new.py"), prob, ref, "cuda")
    for _ in range(10):
        new(*inputs)
    torch.cuda.synchronize()
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
