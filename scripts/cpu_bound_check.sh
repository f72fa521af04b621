#!/usr/bin/env bash
# Run on the GPU machine: is a problem's emitted module CPU-bound, and where does its CPU time go?
# Optimises and benches PROBLEM, then on the same machine times launches (launch_overhead.py) and
# profiles the forward (cpu_profile.py), so the three numbers come from one host.
# usage: scripts/cpu_bound_check.sh PROBLEM.py [PRECISION] [BUDGET]   (env: OUT)
set -u
problem=$1; precision=${2:-bf16}; budget=${3:-12}
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kw_out}
runs=/tmp/kw_cpu_$precision
stem=$(basename "$problem" .py)
PRECISION=$precision KW_RUNS=$runs scripts/gpu_bench.sh "cpu_$stem" "$budget" "$problem" > /dev/null 2>&1
tail -3 "$OUT/cpu_$stem.log" | head -1
dir=$(dirname "$(find "$runs" -name model_new.py -path "*/$stem/*" | head -1)")
python3 scripts/launch_overhead.py "$problem" "$dir" --precision "$precision" 2>&1 | tail -5
python3 scripts/cpu_profile.py "$problem" "$dir" --precision "$precision" --top 20 2>&1 | grep -v "^$" | head -30
