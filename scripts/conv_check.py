"""Dev tool (GPU): the convolution template's first configs against cuDNN, on 3x3 / 1x1 stride-1
shapes of the level-2 problems and ResNets (small-batch ones whose first configs include split-K
variants), small-channel ones (input rows as K steps; `--no-rows` for folded taps), RGB stems of
stride 2, and stride-2 transposed ones (whose box configs read each phase class's taps through
descriptors), input channels-last or NCHW, tf32 and bf16.

For each shape, policy and layout (channels-last, NCHW, or a channels-last input convolved into an
NCHW output, as a fused convolution whose result the model returns writes it): cuDNN
(torch.nn.functional.conv2d / conv3d, conv_transpose2d / 3d) and the first `--configs` configs of
`conv_space` for that shape (box configs, which read the input through tensor descriptors,
alternating with gather configs), each checked against cuDNN's output and timed
by the search's protocol (measure.timer.time_interleaved with device_only: the host's launch
work kept out, L2 flushed; median). An NCHW input's box configs include launch's channels-last
copy. With --pool K, both sides max-pool the result over K x K (x K) windows of stride K: cuDNN
then torch's pool, against the template with the pool fused (box configs pool whole windows of
each box). Prints and appends one JSON row per measurement to OUT/conv_check.jsonl.

usage: PYTHONPATH=src python3 scripts/conv_check.py [--precision tf32 bf16] [--shapes s1 s8] [--configs 7]
       [--layouts channels-last nchw cl-to-nchw] [--no-pixel-runs] [--no-rows] [--flat] [--pool 2] [--float32-in]
       [--extra-configs '[{"BLOCK_M": 256, ..., "BOX_W": 128}]'] [--box-sample 40 --seed 0] [--persist] [--once] [--out DIR]
"""
import argparse
import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F

# name: (batch, Cin, Cout, input spatial, kernel, padding[, a convolution's stride, or a transposed one's
# (stride, output_padding)])
SHAPES = {
    "s1": (32, 64, 128, (224, 224), 3, 1),  # conv2d_relu_bias_add and four more level-2 problems
    "s2": (128, 64, 64, (64, 64), 3, 1),  # conv2d_mish_mish
    "s3": (128, 32, 64, (64, 64), 3, 1),  # conv2d_subtract_hardswish_max_pool_mish
    "s6": (16, 32, 64, (32, 64, 64), 3, 1),  # conv3d_mean
    "s7": (32, 256, 256, (14, 14), 3, 1),  # resnet18 layer 3
    "s8": (32, 64, 64, (56, 56), 3, 1),  # resnet18 layer 1
    "s9": (32, 256, 64, (56, 56), 1, 0),  # resnet50 1x1
    "s10": (128, 8, 32, (256, 256), 3, 0),  # KernelBench level 2 #21 (8 input channels: input rows, or --no-rows)
    "s11": (64, 64, 64, (128, 128), 3, 0),  # KernelBench level 2 #54
    "s12": (2, 512, 512, (7, 7), 3, 1),  # resnet18 layer 4 at batch 2 (4 tiles: the space's split-K configs)
    "s13": (10, 256, 256, (14, 14), 3, 1),  # resnet layer 3 at KernelBench level 3's batch 10
    "s14": (128, 8, 64, (128, 128), 3, 0),  # KernelBench level 2 #85 / #73 (8 input channels: input rows as K steps)
    "s15": (10, 3, 64, (224, 224), 7, 3, 2),  # a ResNet stem at KernelBench level 3's batch 10 (stride 2; RGB rows padded)
    "s16": (10, 3, 32, (224, 224), 3, 1, 2),  # MobileNet-V1's stem (3x3, stride 2)
    "s17": (128, 64, 128, (128, 128), 3, 0),  # KernelBench level 2 #1 (and #31)
    "t1": (128, 64, 64, (128, 128), 3, 1, (2, 1)),  # KernelBench level 2 #2 (ConvTranspose2d, stride 2)
    "t2": (128, 64, 128, (64, 64), 4, 1, (2, 0)),  # KernelBench level 2 #93 / #91
    "t3": (32, 32, 64, (16, 32, 32), 3, 1, (2, 1)),  # KernelBench level 2 #3 (ConvTranspose3d, stride 2)
}
LAYOUTS = ("channels-last", "nchw", "cl-to-nchw")

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--precision", nargs="+", default=["tf32", "bf16"], choices=["tf32", "bf16"])
ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
ap.add_argument("--configs", type=int, default=7, help="first configs of the space to time")
ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS[:2]), choices=LAYOUTS)
ap.add_argument("--no-pixel-runs", action="store_true",
                help="store NCHW outputs without the template's pixel-run hint (an A/B of that hint)")
ap.add_argument("--no-rows", action="store_true",
                help="read small-channel inputs as folded (tap, channel) pairs, not input rows (an A/B of ROW_C)")
ap.add_argument("--flat", action="store_true",
                help="offer the padded-grid (FLAT) configs in the space where they apply (stride-1 convolutions, no pool)")
ap.add_argument("--float32-in", action="store_true",
                help="under bf16, float32 input and weight as a model's are: cuDNN under bf16 autocast, the "
                     "template rounding them to bf16 itself (CAST_BF16), each side's casts and copies timed")
ap.add_argument("--pool", type=int, default=0, help="max-pool window (= stride) fused after the convolution")
ap.add_argument("--extra-configs", default="[]",
                help="a JSON list of configs (BLOCK_M, BLOCK_N, ..., BOX_*) timed after the space's first ones")
ap.add_argument("--box-sample", type=int, default=0,
                help="after the space's first configs, this many box configs drawn at random from the box path's "
                     "whole product (tile, K step, warps, stages, box shape, two-row reads), where the shape has boxes")
ap.add_argument("--seed", type=int, default=0, help="the --box-sample draw's seed")
ap.add_argument("--persist", action="store_true",
                help="time each config also as persistent programs (PERSIST 1 and 2 per SM, the tile loop flattened "
                     "with the K loop; PERSIST 1 not flattened) where it applies (no split K or warp specialization)")
ap.add_argument("--once", action="store_true",
                help="run each kernel once and check it, no timing (for compute-sanitizer: its timing loops take minutes)")
ap.add_argument("--out", default=".")
args = ap.parse_args()

from kernelwright.measure.timer import time_interleaved  # noqa: E402  (after --help)

from kernelwright.analyze.device import device_spec  # noqa: E402
from kernelwright.build.pyload import load_module_from_source  # noqa: E402
from kernelwright.codegen.triton_conv import render_conv  # noqa: E402
from kernelwright.space.conv_space import box_space, conv_space  # noqa: E402

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
log = open(out / "conv_check.jsonl", "a")
torch.backends.cudnn.benchmark = True
pool = "max" if args.pool > 1 else None
mods = {t: load_module_from_source(render_conv(name="kw_conv", transposed=t, pool=None if t else pool),
                                   f"kw_conv_check_{int(t)}_{args.pool}", str(out / "cache"))
        for t in (False, True)}
spec = device_spec()
if args.no_pixel_runs:
    for m in mods.values():
        m._pixel_run = lambda *a: 1
if args.no_rows:
    for m in mods.values():
        m._row_channels = lambda *a: 0


def device_ms(fn) -> float:
    """Median GPU time of fn() as the search times candidates (measure.timer, device_only: the
    host's launch work kept out, the L2 flushed before each run)."""
    return time_interleaved({"f": fn}, device_only=True)["f"].median_ms


def emit(**row):
    print(json.dumps(row), file=log, flush=True)
    print(json.dumps(row), flush=True)


for name in args.shapes:
    n, c, co, sp, k, p, *tr = SHAPES[name]
    nd = len(sp)
    transposed = bool(tr) and isinstance(tr[0], tuple)
    if transposed and pool:
        continue  # (pools are fused into convolutions only)
    mod = mods[transposed]
    if transposed:  # (stride, output_padding); the weight is [Cin, Cout, *kernel]
        st, op = tr[0]
        extra = dict(stride=st, output_padding=op)
        osp = tuple((i - 1) * st - 2 * p + k + op for i in sp)
        conv = (F.conv_transpose2d if nd == 2 else F.conv_transpose3d)
        box = tuple(-(-o // st) for o in osp)  # the largest phase class's sub-grid
    else:
        st = tr[0] if tr else 1
        extra, osp = dict(stride=st), tuple((i + 2 * p - k) // st + 1 for i in sp)
        conv = F.conv2d if nd == 2 else F.conv3d
        box = tuple(o // args.pool * args.pool for o in osp) if pool else osp
        if st > 1:  # (box configs read stride-1 convolutions only)
            box = None
    pixels = n * int(torch.tensor(osp).prod())
    flops = 2 * pixels * co * c * k ** nd // (st ** nd if transposed else 1)  # (taps that meet an input)
    for prec in args.precision:
        cast = prec == "bf16" and args.float32_in
        dt = torch.bfloat16 if prec == "bf16" and not cast else torch.float32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        for layout in args.layouts:
            x = torch.randn(n, c, *sp, device="cuda", dtype=dt)
            w = torch.randn(*((c, co) if transposed else (co, c)), *(k,) * nd, device="cuda", dtype=dt) * 0.1
            if layout != "nchw":
                fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
                x, w = x.to(memory_format=fmt), w.to(memory_format=fmt)
            if pool:
                pool_fn = F.max_pool2d if nd == 2 else F.max_pool3d
                extra["pool_window"] = args.pool
                def op(): return pool_fn(conv(x, w, padding=p, stride=extra["stride"]), args.pool)  # noqa: E704
            else:
                def op(): return conv(x, w, padding=p, **extra)  # noqa: E704

            def lib():
                with torch.autocast("cuda", torch.bfloat16, enabled=cast):
                    return op()
            ref = lib()
            ms = None if args.once else device_ms(lib)
            base = dict(shape=name, precision=prec, float32_in=cast, layout=layout, pixel_runs=not args.no_pixel_runs, rows=not args.no_rows,
                        pool=args.pool)
            emit(**base, impl="cuDNN", ms=ms, tflops=flops / ms / 1e9 if ms else None)
            configs = conv_space(M=pixels, N=co, K=c * k ** nd, precision=prec, elem_bytes=x.element_size(),
                                 spec=spec, channels=c, box_out=None if box is None else (1,) * (3 - nd) + box,
                                 box_window=(1,) * (3 - nd) + (max(args.pool, 1),) * nd,
                                 min_block_m=2 * args.pool ** nd if pool else 1,
                                 flat=args.flat and not transposed and not pool and st == 1)[:args.configs]
            configs += [c for c in json.loads(args.extra_configs) if c not in configs]
            if args.box_sample and box is not None:
                pool_ = [c for c in box_space((1,) * (3 - nd) + box, prec, co, c * k ** nd, spec, 2 if prec == "bf16" else 4,
                                              (1,) * (3 - nd) + (max(args.pool, 1),) * nd)]
                pool_ = [b for b in pool_ if b not in configs]
                configs += random.Random(args.seed).sample(pool_, min(args.box_sample, len(pool_)))
            if args.persist and not (transposed and st > 1):
                configs = [v for c in configs for v in [c] + ([] if c.get("SPLIT_K", 1) > 1 or c.get("WARP_SPEC") else [
                    dict(c, PERSIST=1), dict(c, PERSIST=2), dict(c, PERSIST=1, FLATTEN=0)])]
            for cfg in configs:
                kw = dict(cfg, padding=p, **extra, out_channels_last=layout == "channels-last",
                          INPUT_PRECISION="tf32" if prec == "tf32" else "ieee", **({"CAST_BF16": True} if cast else {}))
                try:
                    y = mod.launch(x, w, **kw)
                    err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    torch.cuda.synchronize()  # (a fault surfaces here, attributed to this config)
                    ms = None if args.once else device_ms(lambda: mod.launch(x, w, **kw))
                except Exception as e:  # a config that fails is a row too
                    emit(**base, impl="template", config=cfg, error=str(e).splitlines()[0][:200])
                    continue
                emit(**base, impl="template", config=cfg, ms=ms, tflops=flops / ms / 1e9 if ms else None, rel_err=err)
log.close()
