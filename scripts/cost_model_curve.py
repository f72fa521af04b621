"""Leave-one-problem-out learning curve of the cost model over a trial database (CPU only).

usage: PYTHONPATH=src python3 scripts/cost_model_curve.py [DB.jsonl ...] [--sizes 0,100,300,1000,100000]
       [--precision tf32] [--min-configs 6] [--seed 0]
Without a file it reads the packaged priors (the trials measured on the H200). Prints a markdown
table: per training size, the held-out tasks, mean Spearman rho, and the geometric-mean regret of
the predicted-fastest config (and of the best of the predicted three) against the fastest measured.
See kernelwright.search.evaluate for the protocol.
"""
import argparse
import sys
import time

from kernelwright.search import TrialDB, packaged_priors
from kernelwright.search.evaluate import learning_curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", nargs="*")
    ap.add_argument("--sizes", default="0,100,300,1000,100000")
    ap.add_argument("--precision")
    ap.add_argument("--min-configs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        print(f"error: --sizes must be integers separated by commas, got {a.sizes!r}", file=sys.stderr)
        return 2
    paths = a.db or packaged_priors()
    records = [r for p in paths for r in TrialDB(p)]
    t0 = time.time()
    try:
        curve = learning_curve(records, sizes, min_configs=a.min_configs, seed=a.seed, precision=a.precision)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{len(records)} records from {', '.join(map(str, paths))}; precision {a.precision or 'all'}; "
          f"seed {a.seed}; {time.time() - t0:.0f} s\n")
    print("| training records asked (other problems) | fitted on, mean | held-out tasks | Spearman rho | regret, top 1 | regret, best of top 3 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for p in curve:
        print(f"| {p.n_train if p.n_train else '0 (chance)'} | {p.train_mean:.0f} | {p.tasks} | {p.rho:.3f} | {p.regret1:.3f} | {p.regret3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
