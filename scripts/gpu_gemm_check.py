#!/usr/bin/env python3
"""GPU check of the Triton GEMM / conv2d templates against cuBLAS / cuDNN at matched precision.

Usage (on the GPU machine):  PYTHONPATH=src python3 scripts/gpu_gemm_check.py --out DIR

Cases: GEMM 4096^3 fp32 (input_precision "ieee", TF32 off in cuBLAS), 4096^3 tf32 (TF32 on),
8192^3 bf16 (bf16 tensors); conv2d implicit GEMM on a ResNet-like layer (N=32, C=256, H=W=56,
3x3, pad 1) under tf32 (cuDNN TF32 on) in NCHW and channels-last, and fp32 (TF32 off).
"*_kmajor" / "*_to_nhwc" cases let the launcher copy operands to the layout TF32 wgmma needs.
Every config is verified against a float32 IEEE reference before it is timed with
triton.testing.do_bench (median).  Every step is in try/except; results go to DIR/gemm_check.json
and a table on stdout.  A global deadline keeps the run under --deadline seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from kernelwright.build.pyload import load_module_from_source
from kernelwright.codegen.triton_gemm import (
    conv_space,
    gemm_space,
    precision_kwargs,
    render_conv2d,
    render_gemm,
)

TOL = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 1e-2}


def rel_err(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def set_tf32(on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def bench(fn):
    return do_bench(fn, warmup=25, rep=60, return_mode="median")


def run_gemm_case(label, prec, size, dtype, mod, max_configs, deadline, log, extra=None, b_kmajor=False):
    """b_kmajor: B is the transposed view of a row-major [N, K] tensor (nn.Linear's weight.T), for
    cuBLAS and the template alike; else B is a row-major [K, N] tensor."""
    res = {"case": label, "precision": prec, "M": size, "N": size, "K": size, "dtype": str(dtype), "trials": [],
           "b_kmajor": b_kmajor}
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(size, size, device="cuda", dtype=torch.float32, generator=g).to(dtype)
        b = torch.randn(size, size, device="cuda", dtype=torch.float32, generator=g).to(dtype)
        if b_kmajor:
            b = b.t().contiguous().t()
        set_tf32(False)
        ref = torch.matmul(a.float(), b.float())
        set_tf32(prec == "tf32")
        base_out = torch.matmul(a, b)
        res["cublas_err"] = rel_err(base_out, ref)
        del base_out
        res["cublas_ms"] = bench(lambda: torch.matmul(a, b))
        flops = 2.0 * size ** 3
        res["cublas_tflops"] = flops / res["cublas_ms"] / 1e9
        log(f"[{label}] cuBLAS {res['cublas_ms']:.3f} ms = {res['cublas_tflops']:.1f} TFLOP/s (err {res['cublas_err']:.2e})")
        space = gemm_space(prec, M=size, N=size, K=size, elem_bytes=a.element_size())[:max_configs]
        pk = precision_kwargs(prec) if dtype == torch.float32 else dict(INPUT_PRECISION="ieee", CAST_BF16=False)
        pk.update(extra or {})
        res["launch_kwargs"] = pk
        limit = max(TOL[prec], 4 * res["cublas_err"])
        run_trials(res, label, space, lambda cfg: mod.launch(a, b, **cfg, **pk), ref, limit, flops,
                   "cublas", deadline, log)
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
        log(f"[{label}] FAILED: {res['error']}")
    return res


def run_conv_case(label, prec, channels_last, mod, max_configs, deadline, log, extra=None,
                  N=32, C=256, H=56, W=56, Cout=256, k=3, pad=1):
    res = {"case": label, "precision": prec, "shape": dict(N=N, C=C, H=H, W=W, Cout=Cout, k=k, pad=pad),
           "channels_last": channels_last, "trials": []}
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(N, C, H, W, device="cuda", generator=g)
        w = torch.randn(Cout, C, k, k, device="cuda", generator=g) / (C * k * k) ** 0.5
        bias = torch.randn(Cout, device="cuda", generator=g)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
        set_tf32(False)
        ref = torch.relu(F.conv2d(x, w, bias, padding=pad))
        set_tf32(prec == "tf32")
        base = lambda: torch.relu(F.conv2d(x, w, bias, padding=pad))  # noqa: E731
        res["cudnn_err"] = rel_err(base(), ref)
        res["cudnn_ms"] = bench(base)
        OH, OW = H + 2 * pad - k + 1, W + 2 * pad - k + 1
        flops = 2.0 * N * OH * OW * Cout * C * k * k
        res["cudnn_tflops"] = flops / res["cudnn_ms"] / 1e9
        log(f"[{label}] cuDNN conv+bias+relu {res['cudnn_ms']:.3f} ms = {res['cudnn_tflops']:.1f} TFLOP/s")
        space = conv_space(prec, batch=N, Cin=C, Cout=Cout, OH=OH, OW=OW)[:max_configs]
        pk = precision_kwargs(prec)
        pk.update(extra or {})
        res["launch_kwargs"] = pk
        limit = max(TOL[prec], 4 * res["cudnn_err"])
        run_trials(res, label, space, lambda cfg: mod.launch(x, w, bias, padding=pad, **cfg, **pk), ref, limit,
                   flops, "cudnn", deadline, log)
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
        log(f"[{label}] FAILED: {res['error']}")
    return res


def run_trials(res, label, space, launch, ref, limit, flops, library, deadline, log):
    """Check and time `launch(cfg)` for every config (until the deadline) against `ref`; appends
    one record per config to res["trials"] and sets res["best"]. `library` names the baseline
    whose time res[f"{library}_ms"] the percentages compare with."""
    for cfg in space:
        if time.time() > deadline:
            res["trials"].append({"config": cfg, "status": "skipped (deadline)"})
            continue
        trial = {"config": cfg}
        try:
            t0 = time.time()
            out = launch(cfg)
            torch.cuda.synchronize()
            trial["first_call_s"] = round(time.time() - t0, 2)
            trial["err"] = rel_err(out, ref)
            del out
            if not trial["err"] <= limit:
                trial["status"] = "wrong"
            else:
                trial["ms"] = bench(lambda: launch(cfg))
                trial["tflops"] = flops / trial["ms"] / 1e9
                trial[f"pct_{library}"] = 100.0 * res[f"{library}_ms"] / trial["ms"]
                trial["status"] = "ok"
        except Exception as e:  # noqa: BLE001
            trial["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"
        res["trials"].append(trial)
        log(f"[{label}] {fmt_cfg(cfg)} {trial.get('status')} "
            f"{trial.get('ms', float('nan')):.3f} ms {trial.get('tflops', float('nan')):.1f} TFLOP/s "
            f"err {trial.get('err', float('nan')):.2e}")
    ok = [t for t in res["trials"] if t.get("status") == "ok"]
    if ok:
        res["best"] = min(ok, key=lambda t: t["ms"])


def fmt_cfg(c):
    return (f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} w{c['num_warps']} "
            f"s{c['num_stages']} sk{c['SPLIT_K']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-configs", type=int, default=16, help="configs tried per case (<= 24)")
    ap.add_argument("--deadline", type=float, default=270.0, help="seconds for the whole run")
    ap.add_argument("--cases", default="gemm_fp32,gemm_tf32,gemm_tf32_kmajor,gemm_bf16,conv_tf32,conv_tf32_nhwc,conv_tf32_to_nhwc,conv_fp32")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    lines = []

    def log(msg):
        msg = f"{time.time() - start:6.1f}s {msg}"
        print(msg, flush=True)
        lines.append(msg)

    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "cuda": torch.version.cuda, "command": " ".join(sys.argv)}
    log(f"env {env}")
    cache = os.path.join(args.out, "kernels")
    results = {"env": env, "cases": []}
    cases = args.cases.split(",")
    per_case = args.deadline / max(1, len(cases))
    mods = {}
    try:
        mods["gemm"] = load_module_from_source(render_gemm(), "kw_gemm", cache)
        from kernelwright.codegen.epilogue import bias_relu
        mods["conv"] = load_module_from_source(render_conv2d(bias_relu()), "kw_conv2d_bias_relu", cache)
    except Exception:  # noqa: BLE001
        log("render/load failed:\n" + traceback.format_exc())
    n = min(args.max_configs, 24)
    for i, case in enumerate(cases):
        deadline = min(start + args.deadline, start + per_case * (i + 1) + 20)
        try:
            if case == "gemm_fp32":
                r = run_gemm_case(case, "fp32", 4096, torch.float32, mods["gemm"], n, deadline, log)
            elif case == "gemm_tf32":
                r = run_gemm_case(case, "tf32", 4096, torch.float32, mods["gemm"], n, deadline, log)
            elif case in ("gemm_tf32_kmajor", "gemm_tf32_kmajor_tma"):  # B copied K-major in the launcher (timed)
                r = run_gemm_case(case, "tf32", 4096, torch.float32, mods["gemm"], n, deadline, log,
                                  extra=dict(KMAJOR=True, TMA=case.endswith("_tma")))
            elif case in ("gemm_tf32_linear", "gemm_tf32_linear_tma"):  # B = W.T (K-major), no copy
                r = run_gemm_case(case, "tf32", 4096, torch.float32, mods["gemm"], n, deadline, log,
                                  extra=dict(TMA=case.endswith("_tma")), b_kmajor=True)
            elif case in ("gemm_bf16_linear", "gemm_bf16_linear_tma"):
                r = run_gemm_case(case, "bf16", 8192, torch.bfloat16, mods["gemm"], n, deadline, log,
                                  extra=dict(TMA=case.endswith("_tma")), b_kmajor=True)
            elif case == "gemm_bf16":
                r = run_gemm_case(case, "bf16", 8192, torch.bfloat16, mods["gemm"], n, deadline, log)
            elif case == "conv_tf32":
                r = run_conv_case(case, "tf32", False, mods["conv"], n, deadline, log)
            elif case == "conv_tf32_nhwc":
                r = run_conv_case(case, "tf32", True, mods["conv"], n, deadline, log)
            elif case == "conv_tf32_to_nhwc":  # NCHW input converted inside the launcher (timed)
                r = run_conv_case(case, "tf32", False, mods["conv"], n, deadline, log, extra=dict(NHWC=True))
            elif case == "conv_fp32":
                r = run_conv_case(case, "fp32", False, mods["conv"], max(4, n // 2), deadline, log)
            else:
                r = {"case": case, "error": "unknown case"}
        except Exception as e:  # noqa: BLE001
            r = {"case": case, "error": f"{type(e).__name__}: {e}"}
        results["cases"].append(r)
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "gemm_check.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)

    print("\n| case | baseline ms | baseline TFLOP/s | best Triton ms | TFLOP/s | % of baseline | best config |")
    print("|---|---|---|---|---|---|---|")
    for r in results["cases"]:
        base_ms = r.get("cublas_ms", r.get("cudnn_ms"))
        base_tf = r.get("cublas_tflops", r.get("cudnn_tflops"))
        b = r.get("best")
        if b and base_ms:
            pct = 100.0 * base_ms / b["ms"]
            print(f"| {r['case']} | {base_ms:.3f} | {base_tf:.1f} | {b['ms']:.3f} | {b['tflops']:.1f} | {pct:.0f}% | {fmt_cfg(b['config'])} |")
        else:
            print(f"| {r['case']} | {base_ms} | {base_tf} | - | - | - | {r.get('error', 'no passing config')[:80]} |")
    with open(os.path.join(args.out, "gemm_check.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
