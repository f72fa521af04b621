"""Dev tool (GPU): do the SM clock and power differ between implementations in the timer's rounds?

Times eager, torch.compile and an emitted model_new.py the way measure.timer does (L2 flush, an
event pair around one call, a synchronisation per round), implementation after implementation,
while `nvidia-smi` samples the SM clock and power every SAMPLE_MS, and prints per implementation
the median time of its rounds with the median SM clock and power sampled during them. Written for
session 10/11's open question: tf32 gemm_gelu_scale's fused GEMM has fewer microseconds of kernels
than compile's GEMM + epilogue in the profiler, yet both time 160-240 us above their kernel sums.

usage: PYTHONPATH=src python3 scripts/clock_probe.py PROBLEM.py MODEL_NEW.py [--precision tf32]
       [--rounds 200] [--sample-ms 20]
"""
import argparse
import statistics
import subprocess
import tempfile
import time

import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.measure.baselines import make_baselines
from kernelwright.measure.l2 import L2Flusher
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser()
ap.add_argument("problem")
ap.add_argument("model_new")
ap.add_argument("--precision", default="tf32")
ap.add_argument("--rounds", type=int, default=200)
ap.add_argument("--sample-ms", type=int, default=20)
args = ap.parse_args()

prob, policy = load_problem(args.problem), get_policy(args.precision)
inputs = prob.make_inputs(0, "cuda")
log = tempfile.NamedTemporaryFile("w+", suffix=".csv")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        f"--loop-ms={args.sample_ms}"], stdout=log, stderr=subprocess.DEVNULL)
samples = []  # (host time the line was read, SM MHz, W)


def read_samples():
    """Lines nvidia-smi wrote since the last read, stamped with the time they were read (the
    sampling period bounds the error)."""
    log.seek(0)
    lines = log.read().splitlines()
    now = time.perf_counter()
    for line in lines[len(samples):]:
        try:
            mhz, watts = (float(v) for v in line.split(","))
        except ValueError:
            mhz = watts = float("nan")
        samples.append((now, mhz, watts))


with torch.no_grad(), policy.active():
    model = prob.make_model("cuda")
    impls = dict(make_baselines(prob, policy, "cuda", inputs=inputs, model=model))
    impls["kernelwright"] = model_new_like(import_model_new(args.model_new), prob, model, "cuda")
    flusher = L2Flusher()
    print(f"{'implementation':16s} {'median us':>10s} {'SM MHz':>8s} {'W':>7s}  (rounds {args.rounds})")
    for name, fn in impls.items():
        for _ in range(20):
            fn(*inputs)
        torch.cuda.synchronize()
        read_samples()
        t0, times = time.perf_counter(), []
        for _ in range(args.rounds):
            flusher.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        time.sleep(2 * args.sample_ms / 1e3)
        read_samples()
        during = [(m, w) for t, m, w in samples if t >= t0]
        mhz = statistics.median(m for m, _ in during) if during else float("nan")
        watts = statistics.median(w for _, w in during) if during else float("nan")
        print(f"{name:16s} {statistics.median(times):10.1f} {mhz:8.0f} {watts:7.1f}")
smi.terminate()
print(torch.__version__, torch.cuda.get_device_name())
