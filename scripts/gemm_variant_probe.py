#!/usr/bin/env python3
"""GPU probe: the Triton GEMM template's TMA variants (one program per tile, persistent, persistent
with warp specialization) against cuBLAS on the level-2 GEMM shape (8192 x 4096 x 4096, B = W.T of
a row-major weight, as nn.Linear gives it).

Usage (on the GPU machine):  PYTHONPATH=src python3 scripts/gemm_variant_probe.py --out DIR

Cases: "bf16" (bf16 tensors), "bf16_cast" (float32 A rounded to bf16 in the kernel, against a cast
kernel + cuBLAS), "tf32" (float32 tensors, TF32 on both sides).  Every variant is checked against a
float32 reference before timing (triton.testing.do_bench, median); failures are recorded, not
raised.  --bias-relu fuses a bias + ReLU epilogue into the Triton kernels.  Results: DIR/gemm_variants.json and a log on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

from kernelwright.build.pyload import load_module_from_source
from kernelwright.codegen.epilogue import bias_relu
from kernelwright.codegen.triton_gemm import precision_kwargs, render_gemm

TILES = {
    "bf16": [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3)],
    "bf16_cast": [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 256, 32, 8, 4), (128, 128, 64, 4, 3)],
    "tf32": [(128, 256, 32, 8, 3), (128, 128, 32, 8, 4), (128, 256, 32, 8, 4)],
}
MODES = {"tma": {}, "persistent": dict(PERSISTENT=True), "persistent_ws": dict(PERSISTENT=True, WARP_SPECIALIZE=True)}


def rel_err(out, ref):
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="bf16,bf16_cast,tf32")
    ap.add_argument("--modes", default="tma,persistent,persistent_ws")
    ap.add_argument("--mnk", default="8192,4096,4096")
    ap.add_argument("--deadline", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--tiles", type=int, default=0, help="only the first N tiles of each case (0: all)")
    ap.add_argument("--bias-relu", action="store_true", help="fuse a bias + ReLU epilogue (cuBLAS side unchanged)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    M, N, K = map(int, args.mnk.split(","))
    flops = 2.0 * M * N * K
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv), "M": M, "N": N, "K": K}
    print(env, flush=True)
    text = render_gemm(bias_relu()) if args.bias_relu else render_gemm()
    mod = load_module_from_source(text, "kw_gemm_probe", os.path.join(args.out, "kernels"))
    results = {"env": env, "cases": []}
    g = torch.Generator(device="cuda").manual_seed(0)
    a32 = torch.randn(M, K, device="cuda", generator=g)
    w32 = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5
    bias = torch.randn(N, device="cuda", generator=g)
    extra = (bias,) if args.bias_relu else ()
    for case in args.cases.split(","):
        res = {"case": case, "trials": []}
        results["cases"].append(res)
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            if case == "tf32":
                a, b, pk, odt = a32, w32.t(), precision_kwargs("tf32"), torch.float32
                ref = a32 @ w32.t()
                lib = lambda: torch.mm(a, b)  # noqa: E731
            else:
                a, b, pk, odt = (a32.bfloat16() if case == "bf16" else a32), w32.bfloat16().t(), \
                    precision_kwargs("bf16"), torch.bfloat16
                ref = a32.bfloat16().float() @ b.float()
                lib = (lambda: torch.mm(a, b)) if case == "bf16" else (lambda: torch.mm(a.bfloat16(), b))  # noqa: E731
            if args.bias_relu:
                ref = torch.relu(ref + bias)
            torch.backends.cuda.matmul.allow_tf32 = case == "tf32"
            res["cublas_ms"] = do_bench(lib, warmup=25, rep=100, return_mode="median")
            res["cublas_err"] = rel_err(lib(), ref)
            res["cublas_tflops"] = flops / res["cublas_ms"] / 1e9
            print(f"[{case}] cuBLAS{' + cast' if case == 'bf16_cast' else ''} {res['cublas_ms']:.4f} ms "
                  f"{res['cublas_tflops']:.0f} TFLOP/s err {res['cublas_err']:.1e}", flush=True)
            for bm, bn, bk, w, s in TILES[case][:args.tiles or None]:
                for mode in args.modes.split(","):
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s, TMA=True,
                               **MODES[mode])
                    t = {"config": cfg, "mode": mode}
                    res["trials"].append(t)
                    if time.time() - start > args.deadline:
                        t["status"] = "skipped (deadline)"
                        continue
                    try:
                        t0 = time.time()
                        out = mod.launch(a, b, *extra, out_dtype=odt, **cfg, **pk)
                        torch.cuda.synchronize()
                        t["first_call_s"] = round(time.time() - t0, 1)
                        t["err"] = rel_err(out, ref)
                        del out
                        if not t["err"] < 1e-2:
                            t["status"] = "wrong"
                        else:
                            t["ms"] = do_bench(lambda: mod.launch(a, b, *extra, out_dtype=odt, **cfg, **pk),
                                               warmup=25, rep=100, return_mode="median")
                            t["tflops"] = flops / t["ms"] / 1e9
                            t["pct_cublas"] = 100 * res["cublas_ms"] / t["ms"]
                            t["status"] = "ok"
                    except Exception as e:  # noqa: BLE001
                        t["status"] = f"error: {type(e).__name__}: {str(e)[:400]}"
                    print(f"[{case}] {bm}x{bn}x{bk} w{w} s{s} {mode:14s} {t['status'][:60]:10s} "
                          f"{t.get('ms', float('nan')):.4f} ms {t.get('tflops', float('nan')):.0f} TFLOP/s "
                          f"{t.get('pct_cublas', float('nan')):.0f}% err {t.get('err', float('nan')):.1e}", flush=True)
        except Exception:  # noqa: BLE001
            res["error"] = traceback.format_exc()[-1500:]
            print(f"[{case}] FAILED\n{res['error']}", flush=True)
    with open(os.path.join(args.out, "gemm_variants.json"), "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
