"""Every Triton kernel optimize would try first for a shipped problem compiles for sm_90.

The interpreter tests never lower a kernel; this compiles them (front end to cubin, no GPU) at the
problems' real sizes: each fusion group with its first three seeds (default, long-chunk streaming,
default with eviction hints) and a split-reduction variant, each node template with its seed
configs (its default, and the depthwise conv's row-streaming kernel), and each fused GEMM (epilogue or row reduction) with its first config without TMA. The compiling runs in one fresh worker process (tests/kernels/target_compile_worker.py), because
the interpreter tests put Triton into interpreter mode for this whole process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "problems"
# unrolled RNNs are slow; the deep level-3 CNNs repeat the blocks of resnet18, mobilenet_v1 and
# inception_block (compiled here) 20-30 times each
SKIP = ("lstm", "gru", "resnet50", "mobilenet_v2", "regnet", "efficientnet_mbconv")
PROBLEMS = sorted(p for p in ROOT.glob("level*/*.py") if p.stem not in SKIP)
CONV = [p for p in PROBLEMS if any(k in p.stem for k in ("conv", "cnn", "resnet"))]
GEMM_CONV = [p for p in PROBLEMS if any(k in p.stem for k in ("gemm", "conv", "cnn", "resnet", "mlp", "transformer", "matmul", "linear"))]
TALL = Path(__file__).resolve().parents[1] / "fixtures" / "sweep" / "depthwise_tall.py"  # 2-, 5-, 7-row streaming kernels
CASES = ([(p, "fp32") for p in PROBLEMS] + [(p, "tf32") for p in CONV]  # tf32: channels-last convolutions
         + [(p, "bf16") for p in GEMM_CONV]  # bf16: operand casts (rounded to nearest even), bf16 layout copies
         + [(TALL, "fp32"), (TALL, "bf16")])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90") / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    worker = Path(__file__).with_name("target_compile_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(out)] + [f"{p}:{pol}" for p, pol in CASES],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("path,policy", CASES, ids=lambda v: f"{v.parent.name}/{v.stem}" if isinstance(v, Path) else v)
def test_first_candidates_compile_for_sm90(results, path, policy):
    failures = results[f"{path}:{policy}"]
    assert not failures, "\n".join(failures)
