"""Training steps of problem files under the implementations named on the command line: bench
--train's runner (kernelwright.bench.training.run_train_bench) with a choice of implementations,
torch.compile's reduce-overhead mode and the backend without its CUDA-graph replay among them.

usage: PYTHONPATH=src python3 scripts/train_bench.py PRECISION STEPS BUDGET OUT.json IMPL[,IMPL...] FILE...
  IMPL: eager, compile (default mode), compile-ro (reduce-overhead), compile-ma (max-autotune),
        kernelwright (torch.compile with kernelwright's backend, BUDGET trials per unit),
        kernelwright-plain (the same with cuda_graphs=False)
The last third of the steps (at most 30) are timed; every implementation's first step is checked
against float64 eager. Needs a CUDA GPU.
"""
import sys

import torch

from kernelwright.backend import backend
from kernelwright.bench.training import run_train_bench
from kernelwright.policy import get_policy


def compiled(**how):
    def wrap(model):
        torch._dynamo.reset()  # each implementation captures its own graphs
        return torch.compile(model, dynamic=False, **how)
    return wrap


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="train_bench.py", usage="train_bench.py PRECISION STEPS BUDGET OUT.json IMPL[,IMPL...] FILE...\n"
        "       (PYTHONPATH=src python3 scripts/train_bench.py ...)", description=__doc__.split("\n\n")[0])
    parser.add_argument("precision", choices=("fp32", "tf32", "bf16"))
    parser.add_argument("steps", type=int)
    parser.add_argument("budget", type=int, help="trials per unit of the backend's search")
    parser.add_argument("json_out", metavar="OUT.json")
    parser.add_argument("impls", metavar="IMPL[,IMPL...]")
    parser.add_argument("files", nargs="+", metavar="FILE")
    a = parser.parse_args(argv)
    precision, steps, budget, json_out, names, files = a.precision, a.steps, a.budget, a.json_out, a.impls.split(","), a.files
    known = {"eager": lambda m: m, "compile": compiled(), "compile-ro": compiled(mode="reduce-overhead"),
             "compile-ma": compiled(mode="max-autotune"),
             "kernelwright": compiled(backend=backend(precision=precision, budget_trials=budget)),
             "kernelwright-plain": compiled(backend=backend(precision=precision, budget_trials=budget, cuda_graphs=False))}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"train_bench.py: unknown implementation(s) {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    run_train_bench(files, get_policy(precision), {n: known[n] for n in names}, steps, max(1, min(30, steps // 3)),
                    json_out, print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
