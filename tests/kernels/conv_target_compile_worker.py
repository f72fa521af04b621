"""Worker for test_conv_target_compile.py, run in a fresh process without TRITON_INTERPRET (Triton
modules imported in interpreter mode cannot compile later): compiles the convolution template with
the first configs of conv_space for sm_90, at real problem sizes on meta tensors, and writes
{case: [{"config", "kernel", "error", "shared"}]} as JSON.

usage: python tests/kernels/conv_target_compile_worker.py OUT.json
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

from kernelwright.analyze.device import H200
from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.codegen.triton_conv import render_conv
from kernelwright.space.conv_space import conv_space

EPI = Epilogue(
    (EpilogueOperand("e0", "col"), EpilogueOperand("e1", "full"), EpilogueOperand("e2", "scalar")),
    "acc = (acc + e0) * e2 + e1\nacc = kw_tanh(acc)",
)

# name: (transposed, x shape, weight shape, conv args, policy, layout, epilogue, configs[, options])
# options: pool=(kind, window) fuses a pool; prologue=True applies PROLOGUE to the input's loads;
# flat=True offers the padded-grid configs (conv_space's flat); only=i compiles the i-th of the first configs alone; with=dict compiles that config's variant
# with these keys changed instead
# policy: fp32 / tf32 / bf16 (float32 tensors rounded in the kernel) / bf16-tensors
CASES = {
    "resnet3x3-cl-tf32": (False, (32, 256, 56, 56), (256, 256, 3, 3), dict(padding=1), "tf32", "cl", False, 4),
    "resnet3x3-nchw-fp32": (False, (32, 256, 56, 56), (256, 256, 3, 3), dict(padding=1), "fp32", "nchw", False, 2),
    "conv2d-bf16-cast-epi": (False, (32, 64, 224, 224), (128, 64, 3, 3), dict(padding=1), "bf16", "cl", True, 2),
    # KernelBench level-2 #1's rows: the second config is a two-row box (TWO_ROWS) of 2 x 128 pixels
    # (so large an output takes two box configs first); a pooled 130 x 130 bf16 input's fifth (under
    # bf16 the third box, boxes alternating with gathers on this smaller output)
    "conv2d-two-rows-tf32-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "tf32", "cl", True, 3, dict(only=1)),
    # its first config (a 128-pixel box) with the K loop warp-specialised: 4 warps, the pass adds its own
    "conv2d-warp-spec-tf32-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "tf32", "cl", True, 1,
                                  dict(only=0, **{"with": dict(WARP_SPEC=1, num_warps=4)})),
    # persistent programs (PERSIST: a loop over tiles, flattened with the K loop) on a box and a padded grid
    "conv2d-persistent-box-bf16-cast-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "bf16", "cl", True, 1,
                                            dict(only=0, **{"with": dict(PERSIST=1)})),
    "conv2d-persistent-flat-tf32-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "tf32", "cl", True, 4,
                                        dict(flat=True, only=2, **{"with": dict(PERSIST=1)})),
    "conv2d-two-rows-maxpool2-bf16": (False, (16, 64, 130, 130), (128, 64, 3, 3), {}, "bf16-tensors", "nchw", False, 5,
                                      dict(pool=("max", (2, 2)), only=4)),
    "conv2d-bf16-tensors": (False, (8, 128, 64, 64), (128, 128, 1, 1), {}, "bf16-tensors", "cl", False, 2),
    "conv3d-cl-tf32-epi": (False, (4, 64, 32, 32, 32), (64, 64, 3, 3, 3), dict(padding=1), "tf32", "cl", True, 2),
    "conv1d-cin3": (False, (16, 3, 4096), (64, 3, 7), dict(stride=2, padding=3), "tf32", "nchw", False, 1),
    # 8 channels: one input row per K step (ROW_C; an NCHW x copied channels-last by launch), and
    # folded (tap, channel) pairs where a dilation along w breaks the rows
    "conv2d-cin8-rows-epi": (False, (128, 8, 256, 256), (32, 8, 3, 3), {}, "tf32", "cl", True, 2),
    "conv2d-cin8-nchw-rows-epi": (False, (128, 8, 256, 256), (32, 8, 3, 3), {}, "tf32", "nchw", True, 1),
    "conv1d-cin8-dilated-fold": (False, (16, 8, 4096), (64, 8, 3), dict(dilation=2), "tf32", "cl", False, 1),
    "stem7x7-cin3-bf16": (False, (32, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3), "bf16", "nchw", False, 1),
    "grouped4": (False, (16, 128, 28, 28), (128, 32, 3, 3), dict(padding=1, groups=4), "tf32", "cl", False, 1),
    "depthwise": (False, (16, 64, 56, 56), (64, 1, 3, 3), dict(padding=1, groups=64), "fp32", "nchw", False, 1),
    "convT2d-s2-tf32-epi": (True, (16, 128, 32, 32), (128, 64, 4, 4), dict(stride=2, padding=1), "tf32", "cl", True, 3),
    "convT3d-s2-op1-bf16": (True, (4, 64, 16, 16, 16), (64, 32, 3, 3, 3),
                            dict(stride=2, padding=1, output_padding=1), "bf16-tensors", "cl", False, 2),
    "convT1d-s3-dil2": (True, (8, 32, 500), (32, 16, 5), dict(stride=3, dilation=2, padding=2, output_padding=1),
                        "fp32", "nchw", False, 1),
    # a late ResNet layer at batch 2: four 128 x 128 tiles, so the first configs come split along K too
    "resnet-layer4-b2-split-epi": (False, (2, 512, 7, 7), (512, 512, 3, 3), dict(padding=1), "tf32", "cl", True, 4),
    # fused pools: box configs pool each box's whole windows in the kernel
    "conv2d-maxpool2-tf32-epi": (False, (128, 64, 64, 64), (128, 64, 3, 3), dict(padding=1), "tf32", "cl", True, 3,
                                 dict(pool=("max", (2, 2)))),
    "conv2d-cin8-rows-avgpool4-prologue": (False, (128, 8, 384, 384), (64, 8, 3, 3), {}, "tf32", "cl", False, 2,
                                           dict(pool=("avg", (4, 4)), prologue=True)),
    "conv3d-avgpool2-bf16": (False, (16, 32, 16, 32, 32), (64, 32, 3, 3, 3), {}, "bf16", "nchw", False, 2,
                             dict(pool=("avg", (2, 2, 2)))),
    # an input prologue (a DenseNet layer's batch norm and ReLU) in the box, per-tap and input-row K loops
    "densenet3x3-prologue-tf32": (False, (16, 128, 56, 56), (32, 128, 3, 3), dict(padding=1), "tf32", "cl", False, 3,
                                  dict(prologue=True)),
    "densenet1x1-prologue-bf16": (False, (16, 512, 28, 28), (128, 512, 1, 1), {}, "bf16-tensors", "nchw", False, 2,
                                  dict(prologue=True)),
    "stem7x7-prologue": (False, (8, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3), "tf32", "nchw", False, 1,
                           dict(prologue=True)),
    # each tile's partial statistics for the normalization after it (codegen/conv_norm.py)
    "conv2d-stats-tf32-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "tf32", "cl", True, 3, dict(stats=True)),
    "conv3d-stats-fp32": (False, (16, 3, 24, 32, 32), (24, 3, 3, 3, 3), {}, "fp32", "nchw", False, 2, dict(stats=True)),
    # padded-grid configs (FLAT: each tap's input tile one 2-D descriptor box): the space's third config
    "conv2d-flat-bf16-cast-epi": (False, (128, 64, 128, 128), (128, 64, 3, 3), {}, "bf16", "nchw", True, 4,
                                  dict(flat=True, only=2)),
    "conv3d-flat-tf32-pad": (False, (16, 32, 32, 64, 64), (64, 32, 3, 3, 3), dict(padding=1), "tf32", "cl", True, 3,
                             dict(flat=True, only=2)),
    "conv2d-flat-stats-bf16-tensors": (False, (64, 64, 64, 64), (64, 64, 3, 3), dict(padding=1), "bf16-tensors", "cl",
                                       False, 3, dict(flat=True, stats=True, only=2)),
    # a sum unit's convolution (codegen/conv_norm.py): statistics kept, the output not written
    # (KernelBench level-2 67: 8 input channels, input rows as K steps)
    "conv2d-sums-no-output-tf32-epi": (False, (128, 8, 256, 256), (64, 8, 3, 3), {}, "tf32", "cl", True, 2,
                                       dict(stats=True, **{"with": dict(write_y=False)})),
    "convT2d-s2-stats-tf32": (True, (16, 64, 32, 32), (64, 64, 3, 3), dict(stride=2, padding=1, output_padding=1),
                              "tf32", "cl", True, 2, dict(stats=True)),
}
PROLOGUE = Epilogue((EpilogueOperand("p0", "col"), EpilogueOperand("p1", "col")), "acc = tl.maximum(acc * p0 + p1, 0.0)")


def _strides(shape, layout):
    """Contiguous strides, or channels-last ones ([N, *spatial, C] memory)."""
    order = list(range(len(shape))) if layout == "nchw" else [0] + list(range(2, len(shape))) + [1]
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return strides


def _out_shape(transposed, x, w, args):
    nd = len(x) - 2
    per = lambda k: [args.get(k, 1 if k in ("stride", "dilation") else 0)] * nd  # noqa: E731
    st, pad, dil, op = per("stride"), per("padding"), per("dilation"), per("output_padding")
    g = args.get("groups", 1)
    if transposed:
        sp = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, k, s, p, d, o in zip(x[2:], w[2:], st, pad, dil, op)]
        return (x[0], w[1] * g, *sp)
    return (x[0], w[0], *[(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(x[2:], w[2:], st, pad, dil)])


def check(case, cache):
    transposed, xs, ws, args, policy, layout, epi, n_configs, *options = CASES[case]
    options = options[0] if options else {}
    pool, window = options.get("pool", (None, ()))
    prologue = options.get("prologue", False)
    dtype = torch.bfloat16 if policy == "bf16-tensors" else torch.float32
    out = _out_shape(transposed, xs, ws, args)
    groups = args.get("groups", 1)
    cin_g = xs[1] // groups
    M, N, K = out[0] * math.prod(out[2:]), out[1] // groups, cin_g * math.prod(ws[2:])
    precision = "bf16" if policy.startswith("bf16") else policy
    stride = args.get("stride", 1)
    box = None  # box configs (tensor descriptors) where the template's descriptor path applies
    if precision in ("tf32", "bf16") and groups == 1 and cin_g >= 16 and (transposed or stride == 1):
        sub = [-(-o // stride) // k * k for o, k in zip(out[2:], window or [1] * (len(out) - 2))]
        box = tuple([1] * (3 - len(sub)) + sub)
    configs = conv_space(M=M, N=N, K=K, channels=cin_g, groups=groups, precision=precision,
                         elem_bytes=2 if dtype == torch.bfloat16 else 4, spec=H200, box_out=box,
                         box_window=tuple([1] * (3 - len(window)) + list(window)),
                         min_block_m=2 * math.prod(window) if pool else 1,
                         flat=options.get("flat", False))[:n_configs]
    if "only" in options:
        configs = configs[options["only"]:options["only"] + 1]
    if "with" in options:
        configs = [dict(c, **options["with"]) for c in configs]
    text = render_conv(EPI if epi else Epilogue(), name=f"kw_conv_{case.replace('-', '_')}", transposed=transposed,
                       pool=pool, prologue=PROLOGUE if prologue else Epilogue(), stats=options.get("stats", False))
    x = meta_tensor(xs, _strides(xs, layout), dtype)
    w = meta_tensor(ws, _strides(ws, layout), dtype)
    operands = []
    if epi:
        operands = [meta_tensor((out[1],), (1,), torch.float32),
                    meta_tensor(out, [0] + _strides(out, layout)[1:], torch.float32),  # broadcast over batch
                    meta_tensor((), (), torch.float32)]
    precision_kw = dict(CAST_BF16=True) if policy == "bf16" else dict(INPUT_PRECISION="tf32") if policy == "tf32" else {}
    rows = []
    for cfg in configs:
        kw = dict(args, **cfg, **precision_kw, out_channels_last=layout == "cl", **({"pool_window": window} if pool else {}))
        try:
            pro = [meta_tensor((xs[1],), (1,), torch.float32)] * len(PROLOGUE.operands) if prologue else []
            builds = _compile(text, case, [x, w, *operands, *pro], kw, cache, len(pro))
        except Exception as e:  # noqa: BLE001 - reported per config
            rows.append(dict(config=cfg, kernel=None, error=f"{type(e).__name__}: {e}", shared=None))
            continue
        if not builds:
            rows.append(dict(config=cfg, kernel=None, error="the launcher launched no kernel", shared=None))
        rows += [dict(config=cfg, kernel=b.kernel, error=b.error, shared=b.shared_bytes, warp_specialized=b.warp_specialized)
                 for b in builds]
    return rows


def _compile(text, case, args, kw, cache, n_prologue=0):
    """compile_source_for_target on a module whose launch() takes `args` (the last `n_prologue` of
    them the prologue's operands) and adds `kw`."""
    call = "*args" if not n_prologue else f"*args[:-{n_prologue}], prologue_operands=args[-{n_prologue}:]"
    wrapped = text + f"\n\n_conv_launch = launch\n\n\ndef launch(*args):\n    return _conv_launch({call}, **{kw!r})\n"
    return compile_source_for_target(wrapped, case.replace("-", "_"), args, cache)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    cache = Path(tempfile.mkdtemp(prefix="kw_conv_sm90_"))
    results = {}
    for case in CASES:
        try:
            results[case] = check(case, cache)
        except Exception as e:  # noqa: BLE001 - reported per case
            results[case] = [dict(config=None, kernel=None, error=f"worker error: {type(e).__name__}: {e}", shared=None)]
    Path(sys.argv[1]).write_text(json.dumps(results))
