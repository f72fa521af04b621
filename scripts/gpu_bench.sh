#!/usr/bin/env bash
# Run on the GPU machine: `kernelwright bench` of PROBLEM... under one precision, writing the bench
# JSON to $OUT/NAME.json, its log to $OUT/NAME.log (also echoed), the trials to $KERNELWRIGHT_DB
# and each problem's optimize output under $KW_RUNS.
# usage: scripts/gpu_bench.sh NAME BUDGET PROBLEM...
#   env: PRECISION       fp32 (default), tf32 or bf16
#        OUT             output folder (default /tmp/kw_out)
#        KW_RUNS         bench --out folder (default /tmp/kw_runs)
#        KERNELWRIGHT_DB trial database (default $OUT/trials.jsonl)
set -u
help() { sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; }
case ${1:-} in -h|--help) help; exit 0 ;; esac
if [ $# -lt 3 ]; then help >&2; exit 2; fi
name=$1; budget=$2; shift 2
unset PYTHONDONTWRITEBYTECODE  # (bytecode and font caches across processes: scripts/kernelbench.sh says why)
export PYTHONPATH=src PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/kw_pyc} \
  MPLCONFIGDIR=${MPLCONFIGDIR:-/tmp/kw_mpl}
OUT=${OUT:-/tmp/kw_out}; mkdir -p "$OUT"
export KERNELWRIGHT_DB=${KERNELWRIGHT_DB:-$OUT/trials.jsonl}
python3 -m kernelwright bench "$@" --precision "${PRECISION:-fp32}" --budget "$budget" --json "$OUT/$name.json" --out "${KW_RUNS:-/tmp/kw_runs}" 2>&1 | tee "$OUT/$name.log"
