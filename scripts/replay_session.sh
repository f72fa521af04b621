#!/usr/bin/env bash
# Run on the GPU machine (session 11, run A): the replay hit path and the row-reduction GEMM's TMA
# variant on the GPU, then the problems below 0.95x of torch.compile in session 10.
# Everything lands in $OUT: tests.log, probe.txt, kernel_profile.txt, summary.txt, session.tgz, clocks.csv.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
work=$(mktemp -d)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/clocks.csv" &
smi=$!
git log -1 --format=%h > "$OUT/tests.log" 2>&1
env -u TRITON_INTERPRET KW_TRITON_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/test_triton_gemm.py -k "rowreduce" >> "$OUT/tests.log" 2>&1
env -u TRITON_INTERPRET timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py >> "$OUT/tests.log" 2>&1
tail -5 "$OUT/tests.log"
for p in resnet_basic_block transformer_block; do
  echo "== $p bf16" >> "$OUT/probe.txt"
  timeout 120 python3 scripts/replay_host_probe.py problems/level3/$p.py --precision bf16 --calls 500 >> "$OUT/probe.txt" 2>&1
done
grep -A4 "timer rounds" "$OUT/probe.txt"
timeout 200 python3 scripts/kernel_profile.py --precision tf32 --budget 12 --out "$work/kp" \
  problems/level3/resnet_basic_block.py problems/level2/gemm_gelu_scale.py > "$work/kp.log" 2>&1
cp "$work/kp/kernel_profile.txt" "$OUT/" 2>/dev/null || tail -20 "$work/kp.log"
OUT=$OUT SECONDS_EACH=${SECONDS_EACH:-150} bash scripts/device_session.sh "bf16 tf32" 12 \
  problems/level3/resnet_basic_block.py problems/level3/transformer_block.py problems/level2/gemm_gelu_scale.py \
  problems/level2/gemm_layer_norm_narrow.py problems/level2/gemm_group_norm_hardtanh.py > /dev/null 2>&1
cat "$OUT/summary.txt"
kill $smi
