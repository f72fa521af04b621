"""Check kernelwright's CUDA C++ templates on a GPU: build for the GPU's arch, compare with
torch on realistic sizes, report registers / shared memory / spills, and time each against
torch (CUDA events, L2 flushed before every timed run, interleaved rounds, median of 50).

    PYTHONPATH=src python3 scripts/gpu_cuda_check.py --out DIR [--runs 50] [--quick]

Writes DIR/gpu_cuda_check.json and prints a table. Every step is guarded: one failure is
recorded and printed, and the rest still run.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch


def _excess(out, ref, tol=1e-4):
    return ((out.double() - ref.double()).abs() - tol * ref.double().abs()).max().item()


class Timer:
    def __init__(self):
        l2 = 60 << 20
        try:
            l2 = torch.cuda.get_device_properties(0).L2_cache_size or l2
        except Exception:
            pass
        self.flush_buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device="cuda")

    def flush(self):
        self.flush_buf.fill_(1.0)

    def time(self, fns: dict, runs: int, warmup_s: float = 0.2) -> dict:
        """Interleaved rounds: each round runs every fn once (flush, event, fn, event)."""
        for f in fns.values():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < warmup_s:
                f()
            torch.cuda.synchronize()
        times = {k: [] for k in fns}
        for _ in range(runs):
            for k, f in fns.items():
                self.flush()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                f()
                b.record()
                b.synchronize()
                times[k].append(a.elapsed_time(b) * 1e3)  # us
        res = {k: {"median_us": statistics.median(v), "mean_us": statistics.fmean(v)}
               for k, v in times.items()}
        # Back-to-back: 20 calls between two events, no flush. When the GPU time per call exceeds
        # the host's launch overhead this is the kernel's time (L2 warm only if the data fits).
        for k, f in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                f()
            b.record()
            b.synchronize()
            res[k]["b2b_us"] = a.elapsed_time(b) * 1e3 / 20
            t0 = time.perf_counter()
            for _ in range(20):
                f()
            res[k]["host_us"] = (time.perf_counter() - t0) * 1e6 / 20
            torch.cuda.synchronize()
        return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"env": {}, "cases": [], "errors": []}

    def err(where, e):
        msg = f"{where}: {type(e).__name__}: {e}"
        print("ERROR", msg, flush=True)
        traceback.print_exc()
        report["errors"].append(msg)

    try:
        from kernelwright.build import compile_cuda, nvrtc_version, resource_usage
        from kernelwright.codegen import cuda_kernels as ck
        import cuda.core

        torch.backends.cuda.matmul.allow_tf32 = False
        report["env"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                         "cuda.core": getattr(cuda.core, "__version__", "?"),
                         "nvrtc": nvrtc_version(), "python": platform.python_version(),
                         "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            import subprocess
            report["env"]["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True).stdout.strip()
        except Exception:
            pass
        arch = "sm_%d%d" % torch.cuda.get_device_capability(0)
        timer = Timer()
    except Exception as e:
        err("setup", e)
        _write(args.out, report)
        return 1

    q = args.quick
    M, N = (512, 8192) if q else (4096, 8192)
    LM, LN = (1024, 8192) if q else (8192, 8192)
    PN = (1 << 24) if q else (1 << 28)
    RM, RN = (1024, 8192) if q else (8192, 8192)
    SM_M, SM_N = (8192, 512) if q else (65536, 512)

    cases = []  # (label, spec, make_inputs, run(launcher, inputs), ref(inputs), bytes)

    def add_softmax(label, m, n, **kw):
        cases.append((label, ck.render_row_softmax(**kw), lambda: (torch.randn(m, n, device="cuda") * 3,),
                      lambda L, xs: L(xs[0]),
                      (lambda xs: torch.log_softmax(xs[0], -1)) if kw.get("log") else (lambda xs: torch.softmax(xs[0], -1)),
                      2 * m * n * 4))

    add_softmax(f"softmax {M}x{N} block reg", M, N, threads=512, vec=4, reg_items=4)
    add_softmax(f"softmax {M}x{N} block online", M, N, threads=512, vec=4, online=True)
    add_softmax(f"softmax {M}x{N} block 3-pass", M, N, threads=256, vec=4)
    add_softmax(f"log_softmax {M}x{N} block reg", M, N, log=True, threads=512, vec=4, reg_items=4)
    add_softmax(f"softmax {SM_M}x{SM_N} warp reg", SM_M, SM_N, threads=256, vec=4, warp_row=True, reg_items=4)

    def add_pw(label, n, **kw):
        cases.append((label, ck.render_pointwise("fmaxf(a * s + b, 0.0f)", ["a", "b"], ["s"], **kw),
                      lambda: (torch.randn(n, device="cuda"), torch.randn(n, device="cuda")),
                      lambda L, xs: L(*xs, scalars=(0.5,)),
                      lambda xs: torch.relu(xs[0] * 0.5 + xs[1]), 3 * n * 4))

    add_pw(f"pointwise relu(a*s+b) n=2^{PN.bit_length() - 1} vec4", PN, threads=256, vec=4, unroll=1)
    add_pw(f"pointwise relu(a*s+b) n=2^{PN.bit_length() - 1} vec4 unroll2", PN, threads=256, vec=4, unroll=2)
    add_pw(f"pointwise relu(a*s+b) n=2^{PN.bit_length() - 1} vec1", PN, threads=256, vec=1, unroll=4)

    def add_ln(label, m, n, **kw):
        def mk():
            return (torch.randn(m, n, device="cuda") * 2 + 1, torch.randn(n, device="cuda"),
                    torch.randn(n, device="cuda"))
        cases.append((label, ck.render_layernorm(**kw), mk, lambda L, xs: L(*xs, 1e-5),
                      lambda xs: torch.nn.functional.layer_norm(xs[0], (n,), xs[1], xs[2], 1e-5),
                      2 * m * n * 4))

    add_ln(f"layernorm {LM}x{LN} welford reg", LM, LN, threads=512, vec=4, reg_items=4, welford=True)
    add_ln(f"layernorm {LM}x{LN} two-pass reg", LM, LN, threads=512, vec=4, reg_items=4, welford=False)
    add_ln(f"layernorm {LM}x{LN} welford stream", LM, LN, threads=256, vec=4, welford=True)

    for op in ("sum", "max"):
        cases.append((f"row_{op} {RM}x{RN}", ck.render_row_reduce(op, threads=256, vec=4, reg_items=4),
                      lambda: (torch.randn(RM, RN, device="cuda"),),
                      lambda L, xs: L(xs[0]),
                      (lambda xs: xs[0].sum(-1)) if op == "sum" else (lambda xs: xs[0].amax(-1)),
                      RM * RN * 4))

    for label, spec, mk, run, ref, nbytes in cases:
        row = {"case": label, "kind": spec.kind, "name": spec.name, "defines": dict(spec.defines)}
        report["cases"].append(row)
        print(f"--- {label}", flush=True)
        try:
            t0 = time.perf_counter()
            b = compile_cuda(spec.source, spec.name, arch, spec.defines, cache_dir=False)
            row["compile_s"] = round(time.perf_counter() - t0, 3)
            use, why = resource_usage(b, device=True)
            row["resources"] = dict(use.__dict__) if use else None
            row["resources_ptxas"] = dict(b.resources.__dict__) if b.resources else None
            if why:
                row["resources_note"] = why
        except Exception as e:
            err(f"{label}: build", e)
            row["error"] = f"build: {e}"
            continue
        try:
            L = ck.make_launcher(spec, cache_dir=False)
            xs = mk()
            out = run(L, xs)
            torch.cuda.synchronize()
            r = ref(xs)
            tol = 1e-3 if spec.kind == "row_reduce" and spec.meta.get("op") == "sum" else 1e-4
            row["excess"] = _excess(out, r, tol)
            row["variant"] = L.last_defines
            row["correct"] = row["excess"] <= tol
        except Exception as e:
            err(f"{label}: run", e)
            row["error"] = f"run: {e}"
            continue
        try:
            t = timer.time({"kw": lambda: run(L, xs), "torch": lambda: ref(xs)}, args.runs)
            row["kw_us"] = t["kw"]["median_us"]
            row["torch_us"] = t["torch"]["median_us"]
            row["kw_mean_us"], row["torch_mean_us"] = t["kw"]["mean_us"], t["torch"]["mean_us"]
            row["speedup"] = row["torch_us"] / row["kw_us"]
            for k in ("kw", "torch"):
                row[f"{k}_b2b_us"], row[f"{k}_host_us"] = t[k]["b2b_us"], t[k]["host_us"]
            row["kw_TBps"] = nbytes / (row["kw_us"] * 1e-6) / 1e12
        except Exception as e:
            err(f"{label}: timing", e)
            row["error"] = f"timing: {e}"
        del xs
        torch.cuda.empty_cache()

    _write(args.out, report)
    print()
    hdr = f"{'case':48s} {'ok':>3s} {'excess':>9s} {'regs':>4s} {'smem':>5s} {'spill':>5s} {'kw us':>9s} {'torch us':>9s} {'x':>6s} {'TB/s':>5s} {'b2b kw/torch us':>16s} {'host us':>7s}"
    print(hdr)
    for r in report["cases"]:
        res = r.get("resources") or {}
        rp = r.get("resources_ptxas") or {}
        spill = (rp.get("spill_stores") or 0) + (rp.get("spill_loads") or 0) if rp else "?"
        print(f"{r['case'][:48]:48s} {('yes' if r.get('correct') else 'NO'):>3s} "
              f"{r.get('excess', float('nan')):9.2e} {str(res.get('registers', '?')):>4s} "
              f"{str(res.get('shared_bytes', '?')):>5s} {str(spill):>5s} "
              f"{r.get('kw_us', float('nan')):9.1f} {r.get('torch_us', float('nan')):9.1f} "
              f"{r.get('speedup', float('nan')):6.2f} {r.get('kw_TBps', float('nan')):5.2f} "
              f"{r.get('kw_b2b_us', float('nan')):7.1f}/{r.get('torch_b2b_us', float('nan')):<8.1f} "
              f"{r.get('kw_host_us', float('nan')):7.1f}"
              + (f"  ERROR {r['error'][:80]}" if "error" in r else ""))
    if report["errors"]:
        print(f"\n{len(report['errors'])} error(s); see gpu_cuda_check.json")
    return 0 if not report["errors"] else 1


def _write(out, report):
    try:
        with open(os.path.join(out, "gpu_cuda_check.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
    except Exception as e:
        print("ERROR writing report:", e)


if __name__ == "__main__":
    sys.exit(main())
