#!/usr/bin/env bash
# Run on the GPU machine: bench a list of problems with kernelwright and write JSON + logs to $OUT.
# usage: scripts/gpu_bench.sh NAME BUDGET PROBLEM...   (env: PRECISION, OUT, KW_RUNS = the runs folder)
set -u
name=$1; budget=$2; shift 2
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kw_out}
export KERNELWRIGHT_DB=${KERNELWRIGHT_DB:-$OUT/trials.jsonl}
python3 -m kernelwright bench "$@" --precision "${PRECISION:-fp32}" --budget "$budget" --json "$OUT/$name.json" --out "${KW_RUNS:-/tmp/kw_runs}" 2>&1 | tee "$OUT/$name.log"
