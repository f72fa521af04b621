"""The learning loop over a trial database, offline (CPU only): the cost model's leave-one-problem-out
learning curve, or (--replay) search strategies replayed on the measured units.

usage: PYTHONPATH=src python3 scripts/cost_model_curve.py [DB.jsonl ...] [--sizes 0,100,300,1000,100000]
       [--precision tf32] [--min-configs 6] [--seed 0]
       PYTHONPATH=src python3 scripts/cost_model_curve.py --replay [DB.jsonl ...] [--precision tf32]
       [--min-configs 20] [--seeds 0,1,2] [--strategies random,model-cold,model-warm,shipped,recorded]
       [--with-priors] [--kappa K] [--explore E] [--no-prior] [--trials N] [--hard T]
Without a file it reads the packaged priors (the trials measured on the H200). The curve: a markdown
table per training size of the held-out tasks, mean Spearman rho, and the geometric-mean regret of
the predicted-fastest config (and of the best of the predicted three) against the fastest measured
(kernelwright.search.evaluate). --replay: per strategy, the trials to reach 95% and 99% of each
unit's fastest measured config, median over units (the spread: one median per seed), and a line per
unit (kernelwright.search.study; warm models learn from the other problems' records), then the
"hard" units (random needs at least --hard trials to 95%, mean over seeds): per strategy its mean
trials to 95% there and the geometric mean of its trials over random's. --kappa / --explore set
the model-based strategies' acquisition (default: ModelBased's), --no-prior drops their analytic
prior (first pick random, the model's ties in candidate order); --trials caps each replay.
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
    ap.add_argument("--min-configs", type=int, help="configs a task needs (default 6; 20 with --replay)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replay", action="store_true", help="replay search strategies on the measured units")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--strategies", default="random,model-cold,model-warm,shipped,recorded")
    ap.add_argument("--kappa", type=float, help="--replay: ModelBased's kappa (lower confidence bound weight)")
    ap.add_argument("--explore", type=float, help="--replay: ModelBased's share of random picks")
    ap.add_argument("--no-prior", action="store_true", help="--replay: ModelBased without its analytic prior")
    ap.add_argument("--trials", type=int, help="--replay: trials per replay at most (default: every config)")
    ap.add_argument("--hard", type=float, default=6.0, help="--replay: random's trials to 95%% that make a unit hard")
    ap.add_argument("--with-priors", action="store_true",
                    help="--replay of the files named: warm models also learn from the packaged trials")
    a = ap.parse_args()
    if a.replay:
        return replay(a)
    sizes = _ints(a.sizes, "--sizes")
    if sizes is None:
        return 2
    paths, records = _records(a)
    t0 = time.time()
    try:
        curve = learning_curve(records, sizes, min_configs=6 if a.min_configs is None else a.min_configs, seed=a.seed, precision=a.precision)
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


def _ints(text: str, flag: str):
    """Comma-separated integers, or None after an error line."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        print(f"error: {flag} must be integers separated by commas, got {text!r}", file=sys.stderr)
        return None


def _records(a):
    """(the database files, their records): the files named, else the packaged priors."""
    paths = a.db or packaged_priors()
    return paths, [r for p in paths for r in TrialDB(p)]


def replay(a) -> int:
    """--replay: the strategies' trials to 95% / 99% of each unit's best, as markdown."""
    from kernelwright.search.study import STRATEGIES, against_random, study, surfaces

    names = a.strategies.split(",")
    if not set(names) <= set(STRATEGIES):
        print(f"error: --strategies takes {', '.join(STRATEGIES)}, got {a.strategies!r}", file=sys.stderr)
        return 2
    seeds = _ints(a.seeds, "--seeds")
    if seeds is None:
        return 2
    paths, records = _records(a)
    min_configs = 20 if a.min_configs is None else a.min_configs
    surfs = surfaces(records, min_configs=min_configs, precision=a.precision)
    if not surfs:
        print(f"error: no unit has {min_configs} measured configs in {', '.join(map(str, paths))}", file=sys.stderr)
        return 1
    t0 = time.time()
    warm = records  # (surfaces come from the files named; --with-priors: warm models learn from the priors too)
    if a.with_priors and a.db:
        warm = records + [r for p in packaged_priors() for r in TrialDB(p)]
    acquisition = {k: v for k, v in (("kappa", a.kappa), ("explore", a.explore)) if v is not None}
    if a.no_prior:
        acquisition["prior"] = None
    if a.explore is not None and not 0.0 <= a.explore <= 1.0:
        print(f"error: --explore must be within [0, 1], got {a.explore}", file=sys.stderr)
        return 2
    rows = study(surfs, warm, strategies=names, seeds=seeds, trials=a.trials, acquisition=acquisition)
    sizes = sorted(len(s.times) for s in surfs)
    print(f"{len(records)} records" + (f" (warm models: {len(warm)} with the packaged trials)" if warm is not records else "")
          + f"; precision {a.precision or 'all'}; {len(surfs)} units of {sizes[0]}-{sizes[-1]} "
          f"measured configs (median {sizes[len(sizes) // 2]}); seeds {a.seeds}; {time.time() - t0:.0f} s\n")
    print("| strategy | trials to 95% of the best (per seed) | trials to 99% (per seed) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r.strategy} | {r.median95:g} ({', '.join(f'{v:g}' for v in r.to95)}) | "
              f"{r.median99:g} ({', '.join(f'{v:g}' for v in r.to99)}) |")
    print("\nper unit, trials to 95% (median over seeds): " + "; ".join(
        f"{k}: " + ", ".join(f"{r.strategy} {r.per_surface[k]:g}" for r in rows) for k in rows[0].per_surface))
    if "random" in names:
        hard = against_random(rows, a.hard)
        print(f"\nunits where random needs >= {a.hard:g} trials to 95% (mean over seeds): {hard[0].units}")
        print("| strategy | mean trials to 95% there | x random's (geometric mean) |\n|---|---:|---:|")
        for h in hard:
            print(f"| {h.strategy} | {h.mean95:.2f} | {h.ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
