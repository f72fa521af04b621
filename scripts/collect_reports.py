"""Concatenate into one markdown file the report.md of every benched problem that is incorrect,
failed, or slower than a ratio of torch.compile (the device machine returns few files, so one file
carries them all). Needs no GPU and no torch.

usage: python3 scripts/collect_reports.py BENCH.json RUNS_DIR OUT.md [--below 0.95]
BENCH.json is `kernelwright bench --json` output; RUNS_DIR is that bench's --out folder
(scripts/gpu_bench.sh uses /tmp/kw_runs), holding levelN/PROBLEM/report.md.
"""
import argparse
import json
import sys
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("bench_json")
ap.add_argument("runs_dir")
ap.add_argument("out")
ap.add_argument("--below", type=float, default=0.95, help="keep problems under this speedup over compile")
args = ap.parse_args()

try:
    rows = json.loads(Path(args.bench_json).read_text())["rows"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"collect_reports: cannot read {args.bench_json}: {e}")
parts = []
for r in rows:
    t = r.get("times", {})
    ratio = t["compile"] / t["kernelwright"] if "compile" in t and t.get("kernelwright") else None
    if r.get("correct") and ratio is not None and ratio >= args.below:
        continue
    report = Path(args.runs_dir) / f"level{r.get('level')}" / r["problem"] / "report.md"
    head = f"<!-- {r['problem']}: vs compile {ratio:.3f} -->" if ratio else f"<!-- {r['problem']}: {r.get('error', 'no timing')} -->"
    parts.append(head + "\n" + (report.read_text() if report.is_file() else "(no report.md)\n"))
Path(args.out).write_text("\n\n".join(parts))
print(f"{len(parts)} report(s) -> {args.out}")
