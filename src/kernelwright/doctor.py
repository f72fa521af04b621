"""`kernelwright doctor`: what this machine can do — GPU, driver, versions, NVRTC, Triton.

Every check is a small function returning (ok, detail) that never raises; `collect()` gathers
them into a JSON-able dict and `render()` turns that into text.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib import metadata

NO_GPU_LINE = "no CUDA GPU: kernels can be verified in the Triton interpreter, nothing can be timed"

_PACKAGES = ("torch", "triton", "numpy", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc",
             "rich", "typer", "kernelwright")

_NVRTC_SRC = r"""
extern "C" __global__ void kw_doctor_axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

_TRITON_SCRIPT = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def kw_doctor_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)

    device = "{device}"
    x = torch.arange(100, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    kw_doctor_kernel[(2,)](x, y, 100, BLOCK=64)
    assert torch.equal(y, x * 2 + 1), "wrong result"
    print("ok")
""")


def _first_line(e: BaseException | str) -> str:
    text = str(e).strip().splitlines()
    return text[-1 if isinstance(e, str) else 0][:300] if text else type(e).__name__


# ------------------------------------------------------------------------- checks

def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except Exception:  # noqa: BLE001
            out[pkg] = None
    try:
        import torch

        out["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


def gpus() -> list[dict]:
    """The CUDA devices torch sees ([] without a GPU or without a CUDA build)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        found = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            found.append({
                "index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                "sms": int(p.multi_processor_count), "memory_gib": round(p.total_memory / 2**30, 1),
                "l2_bytes": int(getattr(p, "L2_cache_size", 0)) or None,
            })
        return found
    except Exception:  # noqa: BLE001
        return []


def check_cuda() -> tuple[bool, str]:
    try:
        import torch

        if torch.version.cuda is None:
            return False, f"torch {torch.__version__} is a CPU-only build"
        if not torch.cuda.is_available():
            return False, f"torch built with CUDA {torch.version.cuda}, but no CUDA device is visible"
        g = gpus()
        return True, f"{len(g)} device(s): " + "; ".join(f"{d['name']} (sm_{d['capability'].replace('.', '')})" for d in g)
    except Exception as e:  # noqa: BLE001
        return False, f"torch.cuda failed: {_first_line(e)}"


def check_driver() -> tuple[bool, str]:
    """Driver version: torch.cuda.driver_version if torch has it, else nvidia-smi, else the
    CUDA driver API (which gives the CUDA version the driver supports)."""
    try:
        import torch

        fn = getattr(torch.cuda, "driver_version", None)
        if callable(fn):
            v = fn()
            if v:
                return True, str(v)
    except Exception:  # noqa: BLE001
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and r.stdout.strip():
                return True, r.stdout.strip().splitlines()[0]
            detail = _first_line(r.stderr or r.stdout or f"exit {r.returncode}")
        except Exception as e:  # noqa: BLE001
            detail = _first_line(e)
    else:
        detail = "nvidia-smi not found"
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        if int(err) == 0 and v:
            return True, f"supports CUDA {v // 1000}.{(v % 1000) // 10} ({detail})"
    except Exception:  # noqa: BLE001
        pass
    return False, f"no NVIDIA driver found ({detail})"


def _nvrtc_arch() -> str:
    g = gpus()
    return "sm_" + g[0]["capability"].replace(".", "") if g else "sm_90"


def check_nvrtc(arch: str | None = None) -> tuple[bool, str]:
    """Compile a small CUDA C++ kernel to cubin with NVRTC through cuda.core, and time it."""
    arch = arch or _nvrtc_arch()
    try:
        from cuda.core import Program, ProgramOptions
    except Exception as e:  # noqa: BLE001
        return False, f"cuda.core not importable: {_first_line(e)} (pip install 'kernelwright[cuda]')"
    try:
        t0 = time.perf_counter()
        obj = Program(_NVRTC_SRC, code_type="c++", options=ProgramOptions(arch=arch)).compile("cubin")
        dt = time.perf_counter() - t0
        code = getattr(obj, "code", b"")
        if isinstance(code, (bytes, bytearray)) and code and not bytes(code).startswith(b"\x7fELF"):
            return False, f"NVRTC returned something that is not a cubin for {arch}"
    except Exception as e:  # noqa: BLE001
        return False, f"NVRTC compile for {arch} failed: {_first_line(e)}"
    version = ""
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        version = f", NVRTC {major}.{minor}"
    except Exception:  # noqa: BLE001
        pass
    return True, f"compiled a small kernel to cubin for {arch} in {dt:.2f} s{version}"


def _run_triton(device: str, interpret: bool, timeout: float) -> tuple[bool, str, float]:
    env = dict(os.environ)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="kw_doctor_") as tmp:
        script = os.path.join(tmp, "kw_doctor_triton.py")
        with open(script, "w") as f:
            f.write(_TRITON_SCRIPT.format(device=device))
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            return False, _first_line(e), time.perf_counter() - t0
        dt = time.perf_counter() - t0
    if r.returncode == 0 and "ok" in r.stdout:
        return True, "", dt
    err = (r.stderr or r.stdout).strip()
    line = err.splitlines()[-1][:300] if err else f"exit code {r.returncode}"
    if "0-dimensional arrays can be converted" in err:
        line += " (Triton 3.6's interpreter needs numpy < 2.4)"
    return False, line, dt


def check_triton_interpreter(timeout: float = 180.0) -> tuple[bool, str]:
    """Run a tiny Triton kernel on CPU tensors with TRITON_INTERPRET=1, in a subprocess."""
    ok, err, dt = _run_triton("cpu", True, timeout)
    if ok:
        return True, f"ran a small kernel on the CPU in {dt:.1f} s (subprocess, TRITON_INTERPRET=1)"
    return False, f"Triton interpreter failed: {err}"


def check_triton_gpu(timeout: float = 180.0) -> tuple[bool, str]:
    """Compile and run a tiny Triton kernel on the GPU, in a subprocess."""
    ok, err, dt = _run_triton("cuda", False, timeout)
    if ok:
        return True, f"compiled and ran a small kernel on the GPU in {dt:.1f} s (subprocess)"
    return False, f"Triton on the GPU failed: {err}"


# ------------------------------------------------------------------------- report

def check_compile_backend() -> tuple[bool, str]:
    """Whether torch.compile finds the "kernelwright" backend (the package's torch_dynamo_backends
    entry point, present once the package is installed)."""
    import torch._dynamo

    if "kernelwright" in torch._dynamo.list_backends():
        return True, 'torch.compile(model, backend="kernelwright") is available'
    return False, "not registered: install the package (pip install -e .) for its entry point"


def _check(fn, *args) -> dict:
    t0 = time.perf_counter()
    try:
        ok, detail = fn(*args)
    except Exception as e:  # noqa: BLE001 - a check never raises
        ok, detail = False, f"check crashed: {type(e).__name__}: {_first_line(e)}"
    return {"ok": bool(ok), "detail": str(detail), "seconds": round(time.perf_counter() - t0, 3)}


def collect(run_triton: bool = True) -> dict:
    """Everything `kernelwright doctor` reports, as a JSON-able dict. Never raises.

    `run_triton=False` skips the Triton subprocess checks (they take a few seconds).
    """
    info: dict = {
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "versions": {},
        "gpus": [],
        "cuda": {},
        "checks": {},
        "notes": [],
    }
    try:
        info["versions"] = versions()
    except Exception as e:  # noqa: BLE001
        info["notes"].append(f"version lookup failed: {_first_line(e)}")
    info["gpus"] = gpus()
    try:
        import torch

        torch_cuda = torch.version.cuda
    except Exception:  # noqa: BLE001
        torch_cuda = None
    checks = info["checks"]
    checks["cuda"] = _check(check_cuda)
    checks["driver"] = _check(check_driver)
    info["cuda"] = {"torch_cuda": torch_cuda, "driver": checks["driver"]["detail"] if checks["driver"]["ok"] else None,
                    "available": bool(info["gpus"])}
    checks["nvrtc"] = _check(check_nvrtc)
    checks["compile_backend"] = _check(check_compile_backend)
    if run_triton:
        checks["triton_interpreter"] = _check(check_triton_interpreter)
        if info["gpus"]:
            checks["triton_gpu"] = _check(check_triton_gpu)
    if not info["gpus"]:
        info["notes"].append(NO_GPU_LINE)
    if info["versions"].get("numpy"):
        try:
            major, minor = (int(x) for x in info["versions"]["numpy"].split(".")[:2])
            if (major, minor) >= (2, 4):
                info["notes"].append("numpy >= 2.4: Triton 3.6's interpreter fails with it; numpy 2.3 works")
        except ValueError:
            pass
    essential = ["nvrtc", "triton_interpreter"] if not info["gpus"] else ["cuda", "driver", "nvrtc", "triton_gpu"]
    info["essential"] = [k for k in essential if k in checks]
    info["ok"] = all(checks[k]["ok"] for k in info["essential"])
    return info


def render(info: dict) -> str:
    """Plain-text report of `collect()`'s dict."""
    lines = ["kernelwright doctor", ""]
    w = 19
    lines.append(f"  {'python':<{w}}{info.get('python', '?')} ({info.get('platform', '?')})")
    for pkg, v in (info.get("versions") or {}).items():
        lines.append(f"  {pkg:<{w}}{v or 'not installed'}")
    cuda = info.get("cuda") or {}
    lines.append(f"  {'torch CUDA':<{w}}{cuda.get('torch_cuda') or 'none (CPU build)'}")
    lines.append(f"  {'driver':<{w}}{cuda.get('driver') or 'none'}")
    lines.append("")
    gpus_ = info.get("gpus") or []
    if gpus_:
        for g in gpus_:
            lines.append(f"  GPU {g['index']}: {g['name']}, compute capability {g['capability']}, "
                         f"{g['sms']} SMs, {g['memory_gib']} GiB"
                         + (f", L2 {g['l2_bytes'] / 2**20:.0f} MiB" if g.get("l2_bytes") else ""))
    else:
        lines.append("  GPU: none")
    lines.append("")
    names = {"cuda": "CUDA", "driver": "driver", "nvrtc": "NVRTC", "triton_interpreter": "Triton interpreter",
             "triton_gpu": "Triton on GPU", "compile_backend": "torch.compile backend"}
    essential = info.get("essential")
    for key, c in (info.get("checks") or {}).items():
        if c.get("ok"):
            mark = "ok  "
        else:
            mark = "FAIL" if essential is None or key in essential else " -- "
        lines.append(f"  [{mark}] {names.get(key, key)}: {c.get('detail', '')}")
    notes = info.get("notes") or []
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines) + "\n"
