#!/usr/bin/env bash
# Run on the GPU machine: `kernelwright bench` of KernelBench files picked by number, one bench
# process per problem under a time limit each (a problem that outlasts it is cut, the rest go on),
# then one merged bench JSON, one log and the reports of slow or failed problems under $OUT (the
# device machine returns few files). KernelBench's files are not shipped: point DIR at a checkout's
# KernelBench/levelN folder.
# usage: scripts/kernelbench.sh NAME DIR NUM...
#   NAME   stem of the files written, at most three (the device machine returns at most 8 files a
#          call): $OUT/NAME.json (bench JSON, rows in NUM order), $OUT/NAME.log (each problem's bench
#          output, then each optimize's log with every line's seconds: where time went, then the
#          table), $OUT/NAME_reports.md where a problem is incorrect, failed or below
#          REPORTS_BELOW x torch.compile (scripts/collect_reports.py)
#   DIR    a folder of KernelBench files named NUM_Name.py
#   env: PRECISION  fp32, tf32 (default) or bf16
#        BUDGET     trials per problem, shared among its units (default 2)
#        LIMIT      seconds one problem may take, optimize and timing together (default 300)
#        DEADLINE   seconds this script may run: each problem's limit is cut to what is left of it
#                   (less 20 s for the merge), so the files under $OUT are written before an outer
#                   time limit ends the call (default none)
#        EXTRA      more bench flags, e.g. "--mode eval"
#        REPORTS_BELOW  speedup over torch.compile under which a problem's report is kept (default 0.95;
#                   1.1 keeps the ties' kernel tables too)
#        OUT        output folder (default /tmp/kw_out)
#        WORK       working folder: per-problem JSON, logs, optimize outputs (default a fresh one)
set -u
help() { sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; }
case ${1:-} in -h|--help) help; exit 0 ;; esac
if [ $# -lt 3 ]; then help >&2; exit 2; fi
name=$1; dir=$2; shift 2
[ -d "$dir" ] || { echo "kernelbench.sh: no folder $dir" >&2; exit 2; }
OUT=${OUT:-/tmp/kw_out}; mkdir -p "$OUT"
work=${WORK:-$(mktemp -d)}; mkdir -p "$work"
# One bytecode cache for every bench process: the device image has no .pyc for its packages and sets
# PYTHONDONTWRITEBYTECODE, so each process compiled its imports again (7.7 s of a tuned problem's
# second optimize on the H100: docs/benchmarks.md, "Mish as one op; 3-D convolutions under tf32;
# level-3 CNNs in eval mode; KernelBench's LSTM and GRU"); matplotlib's font cache kept likewise
# (2.0 s of the same run measured the report charts' text).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/kw_pyc} \
  MPLCONFIGDIR=${MPLCONFIGDIR:-/tmp/kw_mpl}
parts=()
for n in "$@"; do
  f=$(ls "$dir"/"${n}"_*.py 2>/dev/null | head -1)
  if [ -z "$f" ]; then echo "== $n: no file ${n}_*.py in $dir" | tee -a "$OUT/$name.log"; continue; fi
  limit=${LIMIT:-300}
  if [ -n "${DEADLINE:-}" ]; then
    left=$((DEADLINE - SECONDS - 20)); [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 30 ]; then echo "== $n: skipped, DEADLINE reached" | tee -a "$OUT/$name.log"; continue; fi
  fi
  echo "== $(basename "$f") $(date -u +%H:%M:%S) limit ${limit}s" | tee -a "$OUT/$name.log"
  # shellcheck disable=SC2086
  timeout -k 5 "$limit" python3 -m kernelwright bench "$f" --precision "${PRECISION:-tf32}" \
    --budget "${BUDGET:-2}" --json "$work/$n.json" --out "$work/runs" ${EXTRA:-} 2>&1 \
    | grep -v -i 'warn' | tee -a "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "   exit $rc (124: cut at ${limit} s)" | tee -a "$OUT/$name.log"
    progress=$(ls "$work"/runs/level*/"$(basename "$f" .py)".progress.log 2>/dev/null | head -1)
    if [ -n "$progress" ]; then
      { echo "   its optimize's last lines:"; tail -6 "$progress" | sed 's/^/   /'; } | tee -a "$OUT/$name.log"
    fi
  fi
  [ -s "$work/$n.json" ] && parts+=("$work/$n.json")
done
[ ${#parts[@]} -gt 0 ] || { echo "kernelbench.sh: no problem finished" >&2; exit 1; }
python3 - "$OUT/$name.json" "${parts[@]}" <<'PY'
import json, sys
out, parts = sys.argv[1], [json.load(open(p)) for p in sys.argv[2:]]
from kernelwright.bench.runner import summarise
rows = [r for p in parts for r in p["rows"]]
opts = parts[0]["options"]
json.dump({"rows": rows, "summary": summarise(rows, opts.get("baseline_only"), True), "options": opts,
           "gpu": parts[0]["gpu"], "torch": parts[0]["torch"]}, open(out, "w"), indent=2, default=str)
PY
python3 scripts/collect_reports.py "$OUT/$name.json" "$work/runs" "$OUT/${name}_reports.md" --below "${REPORTS_BELOW:-0.95}"
[ -s "$OUT/${name}_reports.md" ] || rm -f "$OUT/${name}_reports.md"
for p in "$work"/runs/level*/*.progress.log; do  # each optimize's log, its lines timed
  [ -f "$p" ] && { echo "== progress: $p"; cat "$p"; }
done >> "$OUT/$name.log"
python3 scripts/bench_table.py "$OUT/$name.json" | tee -a "$OUT/$name.log"
