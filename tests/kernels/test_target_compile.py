"""The Triton kernels optimize would try first for the shipped problems compile for sm_90.

The interpreter tests never lower a kernel; this compiles them (front end to cubin, no GPU) at the
problems' real sizes: each fusion group with its first three seeds (default, long-chunk streaming,
default with eviction hints) and a split-reduction variant, each node template with its seed
configs (its default, and the depthwise conv's row-streaming kernel), and each fused GEMM (epilogue
or row reduction) with its first config without TMA. The compiling runs in one fresh worker process
(tests/kernels/target_compile_worker.py), because the interpreter tests put Triton into interpreter
mode for this whole process.

What decides how a candidate compiles, apart from its sizes, is its kernel family with its config's
flags and dtypes (and the policy where it has a dot), the device functions it calls, the
row-streaming depthwise kernel's shape and 64-bit offsets (the worker's `features`). ALL_CASES
(every shipped problem under each policy that changes its kernels) have about 4,000 candidates,
most of them the same kernel at other sizes: over 20 minutes of compiling on two cores. By default
the test runs SAMPLE, problems whose candidates hold every feature ALL_CASES' candidates hold, and
the worker compiles each of their candidates that brings a feature not compiled before it (about
50). KW_TARGET_COMPILE=all compiles every candidate of ALL_CASES instead and checks that SAMPLE
still holds all their features; run it after adding a template, a config flag or a device function.
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
# inception_block 20-30 times each
SKIP = ("lstm", "gru", "resnet50", "mobilenet_v2", "regnet", "efficientnet_mbconv")
PROBLEMS = sorted(p for p in ROOT.glob("level*/*.py") if p.stem not in SKIP)
CONV = [p for p in PROBLEMS if any(k in p.stem for k in ("conv", "cnn", "resnet"))]
GEMM_CONV = [p for p in PROBLEMS if any(k in p.stem for k in ("gemm", "conv", "cnn", "resnet", "mlp", "transformer", "matmul", "linear"))]
TALL = Path(__file__).resolve().parents[1] / "fixtures" / "sweep" / "depthwise_tall.py"  # 2-, 5-, 7-row streaming kernels
RELU_ATTENTION = TALL.with_name("relu_attention.py")  # attention with elementwise scores
TOKEN_MIXING = TALL.with_name("token_mixing.py")  # a transposed copy read by a Linear
ALL_CASES = ([(p, "fp32") for p in PROBLEMS] + [(p, "tf32") for p in CONV]  # tf32: channels-last convolutions
             + [(TOKEN_MIXING, "tf32")]  # tf32: the transposed copy's tiles
             + [(ROOT / "level3/causal_attention.py", "tf32")]  # tf32: causal attention's TF32 dots
             + [(p, "bf16") for p in GEMM_CONV]  # bf16: operand casts (rounded to nearest even), bf16 layout copies
             + [(TALL, "fp32"), (TALL, "bf16")] + [(RELU_ATTENTION, p) for p in ("fp32", "tf32", "bf16")])
FULL = os.environ.get("KW_TARGET_COMPILE") == "all"
# the problems whose candidates hold every feature of ALL_CASES' candidates (found with
# KW_TARGET_COMPILE=all), with what each brings first
SAMPLE = [
    (TALL, "fp32"), (TALL, "bf16"),  # the row-streaming depthwise kernels of every kernel shape, fp32 and bf16
    (ROOT / "level2/gemm_group_norm_hardtanh.py", "bf16"),  # fused GEMM + row norm, bf16 pointwise and norm groups
    (ROOT / "level1/kl_div.py", "fp32"),  # one-row normalization groups, eviction hints
    (ROOT / "level2/conv2d_tanh_scaling_bias_add_max_pool.py", "tf32"),  # channels-last layout copies, max pool, int64 offsets
    (ROOT / "level2/gemm_gelu_scale.py", "fp32"),  # split-K GEMM epilogue (atomics), erf
    (ROOT / "level2/conv3d_group_norm_mean.py", "bf16"),  # split reductions with a tiled apply pass, bf16
    (ROOT / "level1/reverse_cumsum.py", "fp32"),  # reversed scan
    (ROOT / "level1/max_dim.py", "fp32"),  # multi-row reductions
    (ROOT / "level2/conv_transpose2d_global_avg_pool_bias_add_log_sum_exp_sum_multiply.py", "bf16"),  # GEMM + row reduction
    (ROOT / "level1/cumprod.py", "fp32"),  # product scan
    (ROOT / "level1/depthwise_conv2d.py", "tf32"),  # depthwise pixel-tile kernel
    (ROOT / "level3/transformer_block.py", "bf16"),  # bf16 normalizations of rows
    (ROOT / "level1/softplus.py", "fp32"), (ROOT / "level1/elu.py", "fp32"),  # log1p, expm1
    (ROOT / "level1/frobenius_norm.py", "fp32"), (ROOT / "level1/gelu_tanh.py", "fp32"),  # sqrt, tanh-GELU
    (ROOT / "level2/conv1d_strided_layer_norm_gelu_avg_pool.py", "fp32"),  # multi-row norm with eviction hints
    (ROOT / "level1/cumsum.py", "fp32"), (ROOT / "level1/exclusive_cumsum.py", "fp32"),  # sum scans, exclusive
    (ROOT / "level3/small_cnn.py", "bf16"), (ROOT / "level2/gemm_layer_norm_narrow.py", "fp32"),
    (ROOT / "level3/resnet_basic_block.py", "bf16"), (ROOT / "level2/conv3d_mean.py", "tf32"),
    (ROOT / "level3/vgg.py", "fp32"), (ROOT / "level3/resnet18.py", "bf16"),  # multi-row bf16 norm groups
    (TOKEN_MIXING, "tf32"), (ROOT / "level3/llama_block.py", "fp32"),  # strided copies: transposed tiles; rows
    (ROOT / "level3/causal_attention.py", "fp32"), (ROOT / "level3/causal_attention.py", "tf32"),  # attention, IEEE and TF32 dots
    (RELU_ATTENTION, "bf16"),  # elementwise-score attention (its IEEE and TF32 dots as the attention's)
]
CASES = ALL_CASES if FULL else SAMPLE


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90") / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    worker = Path(__file__).with_name("target_compile_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(out)] + ([] if FULL else ["--new-features"])
                          + [f"{p}:{pol}" for p, pol in CASES], env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_sample_is_shipped():
    assert all(p.is_file() for p, _ in SAMPLE) and set(SAMPLE) <= set(ALL_CASES)


@pytest.mark.parametrize("path,policy", CASES, ids=lambda v: f"{v.parent.name}/{v.stem}" if isinstance(v, Path) else v)
def test_first_candidates_compile_for_sm90(results, path, policy):
    failures = results[f"{path}:{policy}"]["failures"]
    assert not failures, "\n".join(failures)


if FULL:
    def test_the_sample_holds_every_feature(results):
        held = {f for p, pol in SAMPLE for f in results[f"{p}:{pol}"]["features"]}
        missing = sorted({f for r in results.values() for f in r["features"]} - held)
        assert not missing, "add a problem holding these to SAMPLE:\n" + "\n".join(missing)
