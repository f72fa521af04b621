"""Dev tool (CPU or GPU): the host time of an emitted forward, with its generated kernels stubbed.

Each generated kernel module's `launch` runs once for real, then returns those results again, so
what is timed is the Python and library calls around the kernels: the part of a call that makes a
small model host-bound on a GPU. Library ops still compute (on the CPU, tiny SMALL-sized tensors
keep that small). Compare two emitted modules of the same problem (e.g. before / after a change to
emit/program.py); optimize them with `--small` on the CPU under TRITON_INTERPRET=1.

usage: TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/host_time.py PROBLEM.py OUT_DIR [OUT_DIR...] [--profile]
"""
import argparse
import cProfile
import pstats
import timeit

import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser()
ap.add_argument("problem")
ap.add_argument("out_dirs", nargs="+", help="optimize --out folders holding model_new.py")
ap.add_argument("--calls", type=int, default=2000)
ap.add_argument("--profile", action="store_true", help="also print the top functions by own time")
args = ap.parse_args()

prob = load_problem(args.problem, small=True)
for out in args.out_dirs:
    mod = import_model_new(f"{out}/model_new.py")
    new = model_new_like(mod, prob, prob.make_model("cpu"), "cpu")
    for name, unit in list(vars(mod).items()):
        if name.startswith("_k_") and hasattr(unit, "launch"):
            def stub(*a, _real=unit.launch, _memo={}):
                if "out" not in _memo:
                    _memo["out"] = _real(*a)
                return _memo["out"]
            unit.launch = stub
    x = prob.make_inputs(0, "cpu")
    with torch.no_grad():
        new(*x)
        best = min(timeit.repeat(lambda: new(*x), number=args.calls, repeat=5)) / args.calls
        print(f"{out}: {best * 1e6:.1f} us per forward (generated kernels stubbed)")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                new(*x)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
