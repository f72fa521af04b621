#!/usr/bin/env python3
"""Append the rows of `kernelwright bench --json` output to docs/data/results.csv (long format: one
row per problem and implementation; the columns are documented at the top of docs/benchmarks.md).
Needs no GPU and no torch.

usage: python3 scripts/results_csv.py BENCH.json --commit C --suite S [--date YYYY-MM-DD] [--csv PATH]
A problem from KernelBench (its path outside this project's problems/ folder) is named
kernelbench/levelN/NAME, one of the project's own problems levelN/NAME; training steps (bench
--train, scripts/train_bench.py) add ":train_step".
"""
import argparse
import csv
import datetime
import json
import sys
from pathlib import Path

# bench's (and scripts/train_bench.py's) timing keys -> the implementation column; keys not listed
# (A/B side runs) are skipped.
IMPLEMENTATIONS = {"eager": "eager", "compile": "torch.compile", "compile:reduce-overhead": "torch.compile:reduce-overhead",
                   "compile-ro": "torch.compile:reduce-overhead", "compile-ma": "torch.compile:max-autotune",
                   "kernelwright:graphs": "kernelwright:graphs", "kernelwright:plain": "kernelwright:plain",
                   "kernelwright-plain": "kernelwright:plain", "kernelwright": "kernelwright"}
COLUMNS = ["commit", "date", "gpu", "policy", "suite", "problem", "implementation", "median_ms", "verified"]


def problem_name(row: dict, train: bool = False) -> str:
    own = "problems/" in Path(row.get("path", "")).as_posix()
    return f"{'' if own else 'kernelbench/'}level{row.get('level')}/{row['problem']}" + (":train_step" if train else "")


def rows_of(data: dict, commit: str, suite: str, date: str):
    gpu, policy = data["gpu"], data["options"]["precision"]
    for r in data["rows"]:
        times = r.get("times") or {}
        for key, impl in IMPLEMENTATIONS.items():
            ours = impl.startswith("kernelwright")
            if key not in times and not (key == "kernelwright" and r.get("error")):
                continue
            ms = times.get(key)
            verified = ("true" if r.get("correct") else "false") if ours else ""
            yield dict(commit=commit, date=date, gpu=gpu, policy=policy, suite=suite,
                       problem=problem_name(r, bool(data.get("train"))),
                       implementation=impl, median_ms="" if ms is None else f"{ms:.4f}", verified=verified)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_json")
    ap.add_argument("--commit", required=True, help="the tree that was measured")
    ap.add_argument("--suite", required=True, help="the name of this bench call's problem set")
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    ap.add_argument("--csv", default=str(Path(__file__).resolve().parent.parent / "docs/data/results.csv"))
    args = ap.parse_args()
    try:
        data = json.loads(Path(args.bench_json).read_text())
        new = list(rows_of(data, args.commit, args.suite, args.date))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"results_csv: cannot read {args.bench_json}: {e}")
    with open(args.csv, "a", newline="") as f:
        csv.DictWriter(f, COLUMNS, lineterminator="\n").writerows(new)
    print(f"results_csv: {len(new)} rows appended to {args.csv}")


if __name__ == "__main__":
    main()
