#!/usr/bin/env bash
# Run `optimize` over the small KernelBench-style programs in tests/fixtures/sweep/*.py (instance
# norm after a conv, tensors made in forward, training-mode dropout, channel shuffle, dense/fire/SE
# blocks, dilated / grouped / transposed / depthwise convs, einsum, losses, scans, pools, RNNs) under
# each precision policy, on the CPU in the Triton interpreter by default, and print one line per
# run: the policy, the program, a verdict, and the run's verify line. Verdicts:
#   PASS      the generated program verified and ships
#   KEPT      it verified but was slower than eager as a whole, so the original forward ships (a pass)
#   SKIP      eager itself cannot run the model under that policy here (e.g. lstm_small under bf16
#             on the CPU: oneDNN has no bf16 LSTM)
#   FALLBACK  the generated program failed verification and the original forward shipped
#   FAIL      optimize exited non-zero with a failed verification
#   ERROR     optimize exited non-zero otherwise
# Exits 1 if any run is not PASS, KEPT or SKIP. A run takes about 15 s on 2 CPU cores.
# usage: scripts/cpu_sweep.sh [POLICY...]   (default: tf32 bf16 fp32)
#   env: OUT     output folder (one optimize folder and log per run; default a fresh temporary one)
#        BUDGET  optimize's --budget
#        FILES   the programs (default every sweep fixture)
#        TRITON_INTERPRET=0 on a GPU machine compiles and times the kernels instead of interpreting them
set -u
case ${1:-} in -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
policies=${*:-tf32 bf16 fp32}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
export PYTHONPATH=src TRITON_INTERPRET=${TRITON_INTERPRET:-1}
budget=${BUDGET:+--budget $BUDGET}
bad=0
for pol in $policies; do
  for f in ${FILES:-tests/fixtures/sweep/*.py}; do
    n=$(basename "$f" .py)
    log="$out/${pol}_$n.log"
    timeout 600 python3 -m kernelwright optimize "$f" --out "$out/${pol}_$n" --precision "$pol" $budget > "$log" 2>&1
    rc=$?
    verdict=PASS
    if grep -q "generated program FAILED verification" "$log"; then verdict=FALLBACK
    elif grep -q "is slower than eager .*keeps the original forward" "$log"; then verdict=KEPT  # by design
    elif grep -q "the model itself fails under" "$log"; then verdict=SKIP  # eager cannot run it here
    elif [ $rc -ne 0 ]; then verdict=$(grep -q "^verify: FAIL" "$log" && echo FAIL || echo ERROR); fi
    case $verdict in PASS|SKIP|KEPT) ;; *) bad=1 ;; esac
    echo "$pol $n $verdict $(grep -h '^verify:' "$log" | tail -1) $(grep -h 'error:' "$log" | head -1)"
  done
done
exit $bad
