#!/usr/bin/env python3
"""Achieved bandwidth of each problem in a `bench --json` file: the problem's minimum bytes (its
inputs, parameters and outputs, each moved once; from a capture on the meta device) over the
measured kernelwright / torch.compile time, against the copy ceiling of ../shared/facts.md.

usage: PYTHONPATH=src python3 scripts/bandwidth_table.py BENCH.json [--ceiling-tbs 4.21] [--only a,b,...]
"""
import argparse
import json
import math

from kernelwright.capture import capture
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser()
ap.add_argument("bench")
ap.add_argument("--ceiling-tbs", type=float, default=4.21)
ap.add_argument("--skip", default="gemm,conv,matmul,linear,matrix_vector", help="name parts of problems to leave out")
args = ap.parse_args()
skip = [s for s in args.skip.split(",") if s]
data = json.load(open(args.bench))
print("| problem | min bytes (GB) | kernelwright TB/s | % of copy | compile TB/s | kw <= compile |")
print("|---|---:|---:|---:|---:|---|")
wins, ratios, n = 0, [], 0
for r in sorted(data["rows"], key=lambda r: r["problem"]):
    if any(s in r["problem"] for s in skip) or "kernelwright" not in r.get("times", {}):
        continue
    g = capture(load_problem(r["path"]))
    nbytes = sum(i.meta.nbytes for i in g.inputs if i.meta is not None) + sum(g.meta(o).nbytes for o in g.outputs)
    kw, comp = r["times"]["kernelwright"], r["times"]["compile"]
    tbs = nbytes / (kw * 1e-3) / 1e12
    n += 1
    wins += kw <= comp
    ratios.append(comp / kw)
    print(f"| {r['problem']} | {nbytes / 1e9:.2f} | {tbs:.2f} | {100 * tbs / args.ceiling_tbs:.0f}% | "
          f"{nbytes / (comp * 1e-3) / 1e12:.2f} | {'yes' if kw <= comp else 'no'} |")
print(f"\n{n} problems: kernelwright <= torch.compile on {wins} ({100 * wins / n:.0f}%), "
      f"geomean compile/kernelwright time {math.exp(sum(map(math.log, ratios)) / n):.3f}")
