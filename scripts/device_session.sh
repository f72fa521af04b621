#!/usr/bin/env bash
# Run on the GPU machine: the GPU test files named in $GPU_TESTS, each alone and with
# TRITON_INTERPRET unset (compiled kernels, not the interpreter), then `kernelwright bench` of PROBLEM...
# under each precision, packing the results into two files under $OUT (the device machine returns
# few files):
#   summary.txt  the last lines of each test file's run and each bench's table
#   session.tgz  bench JSON and logs, the trial database, and each problem's report.md,
#                result.json and model_new.py
# usage: scripts/device_session.sh "bf16 tf32" BUDGET PROBLEM...
#   env: OUT           output folder (default /tmp/kw_out)
#        GPU_TESTS     test files to run first, e.g. "tests/e2e/test_cuda_graphs.py" (default none)
#        SECONDS_EACH  time limit of one precision's bench (default 260)
#        WORK          working folder (default a fresh temporary one)
set -u
help() { sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; }
case ${1:-} in -h|--help) help; exit 0 ;; esac
if [ $# -lt 3 ]; then help >&2; exit 2; fi
precisions=$1; budget=$2; shift 2
OUT=${OUT:-/tmp/kw_out}; mkdir -p "$OUT"
work=${WORK:-$(mktemp -d)}; mkdir -p "$work"
export PYTHONPATH=src PYTHONUNBUFFERED=1 KERNELWRIGHT_DB=$work/trials.jsonl
: > "$OUT/summary.txt"
for f in ${GPU_TESTS:-}; do  # compiled kernels, not the interpreter
  env -u TRITON_INTERPRET timeout 150 python3 -m pytest -q -p no:cacheprovider "$f" > "$work/$(basename "$f" .py).log" 2>&1
  { echo "== $f"; tail -2 "$work/$(basename "$f" .py).log"; } >> "$OUT/summary.txt"
done
for p in $precisions; do
  timeout "${SECONDS_EACH:-260}" python3 -m kernelwright bench "$@" --precision "$p" --budget "$budget" \
    --json "$work/bench_$p.json" --out "$work/runs_$p" > "$work/bench_$p.log" 2>&1
  { echo "== bench $p (rc $?)"; grep -v -i warn "$work/bench_$p.log" | tail -30; } >> "$OUT/summary.txt"
done
find "$work" -path '*/.build' -prune -o -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \
  -o -name report.md -o -name model_new.py \) -print | sed "s|^$work/||" > "$work/files.txt"
tar czf "$OUT/session.tgz" -C "$work" -T "$work/files.txt"
cat "$OUT/summary.txt"
