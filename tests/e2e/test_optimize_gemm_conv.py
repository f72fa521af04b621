"""End to end on the CPU for the shipped GEMM / convolution problems: optimize at the problem's
SMALL size in the Triton interpreter, under fp32, bf16 (explicit bf16 operands, checked against
eager under bf16 autocast; dense convolutions run channels-last) and tf32 (channels-last too, TF32
dots), and check the emitted ModelNew against Model.

Every problem runs under fp32 (each is a fusion pattern of its own), with three exceptions below.
bf16 adds the operand casts and the channels-last layouts, which are the same for every problem of
a kind (the name's anchor: conv2d, conv_transpose3d, gemm, ...), so it runs on the first problem
of each kind per level, and on one GEMM problem per epilogue family; tf32 adds the channels-last
layouts without the casts (bf16 runs them too) and TF32 dots, on the first convolution problem of
each kind of levels 1 and 2 (the level-3 networks are made of those kinds). KW_E2E_ALL=1 runs every
problem under every policy instead."""
from __future__ import annotations

import os
import re

from pathlib import Path

import pytest

from kernelwright.pipeline import Options, optimize_problem
from kernelwright.problem import load_problem

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2] / "problems"
ANCHORED = ("gemm", "conv", "matmul", "linear", "matrix_vector", "mlp", "cnn", "resnet", "transformer", "attention")
# the deep level-3 CNNs repeat the blocks of resnet18, mobilenet_v1 and inception_block (which stay)
# 20-30 times each: minutes apiece in the interpreter for no path the others do not take; the
# ConvNeXt block is depthwise_conv2d's 7x7 kernel and a channels-last LayerNorm MLP (checked by
# `kernelwright fuzz problems/level3/convnext_block.py --small`)
DEEP = ("resnet50", "mobilenet_v2", "regnet", "efficientnet_mbconv", "convnext_block")
PROBLEMS = sorted(p for p in ROOT.glob("level*/*.py") if any(k in p.stem for k in ANCHORED) and p.stem not in DEEP)
ALL = os.environ.get("KW_E2E_ALL") == "1"
# Not under fp32: the fp32 search picks the row-streaming depthwise kernel with one-channel tiles,
# minutes in the interpreter (tf32 and bf16 run both problems; tests/kernels run that kernel).
FP32_SLOW = ("depthwise_conv2d", "conv2d_depthwise_batch_norm_relu6")
# Under fp32 only: resnet18 is resnet_basic_block's blocks (which runs under every policy) eight
# times, several minutes under tf32 and bf16.
FP32_ONLY = ("resnet18",)
# the GEMM problems of level 2 by epilogue family: the first of each runs under bf16
GEMM_FAMILIES = {"gemm_batch_norm_relu": "batch norm", "gemm_bias_relu": "pointwise", "gemm_gelu_scale": "pointwise",
                 "gemm_group_norm_hardtanh": "group norm", "gemm_group_norm_swish": "group norm",
                 "gemm_layer_norm": "row norm", "gemm_layer_norm_narrow": "row norm", "gemm_logsumexp": "row reduction",
                 "gemm_sigmoid_sum": "row reduction", "gemm_softmax": "softmax"}


def _kind(p):
    if p.stem in GEMM_FAMILIES:
        return GEMM_FAMILIES[p.stem]
    if "depthwise" in p.stem:
        return "depthwise"
    return re.match(r"conv_transpose\dd|conv\dd|[a-z]+", p.stem).group(0)


def _per_kind(paths):
    """The first problem of each kind per level, in name order."""
    seen, out = set(), []
    for p in paths:
        if (p.parent.name, _kind(p)) not in seen:
            seen.add((p.parent.name, _kind(p)))
            out.append(p)
    return out


CONVS = [p for p in PROBLEMS if any(k in p.stem for k in ("conv", "cnn", "resnet"))]
if ALL:
    CASES = ([(p, "fp32") for p in PROBLEMS] + [(p, "tf32") for p in CONVS] + [(p, "bf16") for p in PROBLEMS])
else:
    SAMPLED = [p for p in PROBLEMS if p.stem not in FP32_ONLY]
    CASES = ([(p, "fp32") for p in PROBLEMS if p.stem not in FP32_SLOW]
             + [(p, "tf32") for p in _per_kind(c for c in CONVS if c in SAMPLED and c.parent.name != "level3")]
             + [(p, "bf16") for p in _per_kind(SAMPLED)])


def test_every_gemm_and_conv_problem_is_covered():
    names = {p.stem for p in PROBLEMS}
    assert {"matmul", "conv2d", "depthwise_conv2d", "conv_transpose2d", "gemm_softmax", "conv3d_mean",
            "mlp", "resnet_basic_block"} <= names
    assert len(PROBLEMS) >= 25


@pytest.mark.parametrize("path,policy", CASES, ids=lambda v: f"{v.parent.name}/{v.stem}" if isinstance(v, Path) else v)
def test_optimize_gemm_conv(path, policy, tmp_path):
    result = optimize_problem(load_problem(path, small=True), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, small=True, precision=policy,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    assert (tmp_path / "out" / "model_new.py").is_file()
    # dense (ungrouped) 2-D / 3-D convolutions run channels-last under tf32 (through the norms after them
    # too), unless the exact algebra computed the problem without its convolution
    rewrites = result.get("rewrites", [])
    convs = any(k in path.stem for k in ("conv", "cnn", "resnet")) \
        and not any(k in path.stem for k in ("depthwise", "conv1d", "grouped")) \
        and not any("conv_spatial_reduction" in n for n in rewrites)
    if policy in ("tf32", "bf16") and convs:
        assert any("channels-last" in n for n in result.get("rewrites", [])), result.get("rewrites")
    if policy == "bf16":  # GEMMs and convolutions (depthwise ones too) read bf16 operands
        assert any("bf16 operands" in n for n in result.get("rewrites", [])), result.get("rewrites")
