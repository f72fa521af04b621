"""Small CUDA runtime for kernels written by kernelwright.

Compiles CUDA C++ with NVRTC (through ``cuda.core``) for the current GPU's exact arch, caches the
loaded kernels in this process, and launches them on torch's current CUDA stream. It is copied
beside emitted modules (as ``kw_cuda_runtime.py``) and needs only torch, numpy and cuda.core;
kernelwright itself uses the same file, so emitted code and the tuner launch kernels identically.

Kernel kinds (the templates in kernelwright/codegen/templates/cuda):
  pointwise    out = f(x0, x1, ..., s0, ...) over equally shaped contiguous fp32 tensors
  row_softmax  softmax / log_softmax over the last dim of fp32 [..., N]
  row_reduce   sum / mean / max / min over the last dim of fp32 [..., N] -> [...]
  layernorm    layer norm over the last dim, optional weight / bias
"""

import hashlib
import threading

import numpy as np
import torch

_LOCK = threading.Lock()
_KERNELS = {}  # (device, key) -> cuda.core Kernel
_STREAMS = {}  # (device, stream handle) -> cuda.core Stream
_SMS = {}  # device -> multiprocessor count
_CONFIGS = {}  # (grid, block, shmem) -> LaunchConfig
_LOCAL = threading.local()


def _device(index=None):
    """The cuda.core Device for torch's current device, made current in this thread."""
    from cuda.core import Device

    idx = torch.cuda.current_device() if index is None else int(index)
    done = getattr(_LOCAL, "current", None)
    if done is None:
        done = _LOCAL.current = {}
    dev = done.get(idx)
    if dev is None:
        dev = Device(idx)
        dev.set_current()
        done[idx] = dev
    return dev


def arch_of(index=None):
    """'sm_XY' of a torch device (the current one by default)."""
    idx = torch.cuda.current_device() if index is None else int(index)
    major, minor = torch.cuda.get_device_capability(idx)
    return f"sm_{major}{minor}"


def sm_count(index=None):
    idx = torch.cuda.current_device() if index is None else int(index)
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def nvrtc_compile(source, name, defines=None, arch=None):
    """Compile `source` to a cubin for `arch` (default: the current GPU); returns bytes."""
    from cuda.core import Program, ProgramOptions

    macros = [(str(k), str(v)) for k, v in sorted((defines or {}).items())]
    opts = ProgramOptions(arch=arch or arch_of(), std="c++17", define_macro=macros or None,
                          name=name)
    return bytes(Program(source, code_type="c++", options=opts).compile("cubin").code)


def load_kernel(cubin, name):
    """Load a cubin on the current device and return its kernel `name` (cached per process)."""
    from cuda.core import ObjectCode

    dev = _device()
    key = (dev.device_id, hashlib.sha256(cubin).hexdigest(), name)
    with _LOCK:
        k = _KERNELS.get(key)
    if k is None:
        k = ObjectCode.from_cubin(cubin, name=name).get_kernel(name)
        with _LOCK:
            _KERNELS[key] = k
    return k


def _stream():
    """cuda.core Stream wrapping torch's current stream (wrappers cached by handle)."""
    dev = _device()
    idx = dev.device_id
    try:  # cheap: the raw handle without building a torch Stream object
        handle = torch._C._cuda_getCurrentRawStream(idx)
    except Exception:
        handle = torch.cuda.current_stream(idx).cuda_stream
    s = _STREAMS.get((idx, handle))
    if s is None:
        s = _STREAMS[(idx, handle)] = dev.create_stream(torch.cuda.current_stream(idx))
    return s


def _arg(a):
    # Pointers go as Python ints (intptr_t); integers as int64 ('long long' in the kernels);
    # floats as float32 ('float'). None is a null pointer.
    if isinstance(a, torch.Tensor):
        return a.data_ptr()
    if a is None:
        return 0
    if isinstance(a, (bool, np.bool_)):
        return np.int32(a)
    if isinstance(a, (int, np.integer)):
        return np.int64(a)
    if isinstance(a, (float, np.floating)):
        return np.float32(a)
    return a


def launch(kernel, grid, block, *args, shmem=0):
    """Launch `kernel` on torch's current stream. Tensors are passed as device pointers."""
    from cuda.core import LaunchConfig, launch as _launch

    key = (grid, block, shmem)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = _CONFIGS[key] = LaunchConfig(grid=grid, block=block, shmem_size=int(shmem))
    _launch(_stream(), cfg, kernel, *[_arg(a) for a in args])


# ---- launch geometry (pure Python) ---------------------------------------------------------

def pointwise_grid(n, threads, vec, unroll, sms, waves=4):
    """Blocks for the grid-stride pointwise kernel: enough for every element, at most `waves`
    full-occupancy waves (2048 threads per SM)."""
    need = -(-int(n) // (threads * vec * unroll))
    cap = sms * max(1, 2048 // threads) * waves
    return max(1, min(need, cap))


def rows_per_block(threads, warp_row):
    return threads // 32 if warp_row else 1


def row_grid(m, threads, warp_row):
    rpb = rows_per_block(threads, warp_row)
    return max(1, -(-int(m) // rpb))


def reg_capacity(threads, vec, warp_row, reg_items):
    """Largest N the register-cached variant holds (0 when it is not register-cached)."""
    return (32 if warp_row else threads) * vec * reg_items


# ---- kernels with their launch logic -------------------------------------------------------

def _rows(x):
    """(x as [M, N], M, N, row stride): views only; copies when rows are not evenly strided."""
    if x.dim() == 0:
        x = x.reshape(1, 1)
    n = x.shape[-1]
    if x.dim() == 2 and x.stride(1) == 1 and (x.shape[0] <= 1 or x.stride(0) >= n):
        x2 = x
    else:
        x2 = x.contiguous().view(-1, n)
    ld = x2.stride(0) if x2.shape[0] > 1 else n
    return x2, x2.shape[0], n, ld


def _check(t, what):
    if not isinstance(t, torch.Tensor) or not t.is_cuda or t.dtype != torch.float32:
        raise ValueError(f"{what} must be a float32 CUDA tensor")


class CudaKernel:
    """One templated kernel with its launch logic.

    kind     'pointwise' | 'row_softmax' | 'row_reduce' | 'layernorm'
    source   rendered CUDA C++ (the knobs are -D macros, so one source serves all variants)
    name     the extern "C" kernel name in `source`
    defines  the chosen knobs, e.g. {'THREADS': 256, 'VEC': 4, 'WARP_ROW': 0, 'REG_ITEMS': 0}
    compile_fn  optional callable(source, name, defines, arch) -> cubin bytes (kernelwright passes
             its cached builder); default: NVRTC in this process
    strict   when False (default), a call whose shapes break a knob's precondition (VEC=4 with
             N % 4 != 0 or misaligned rows; REG_ITEMS too small for N) runs a safe variant
             (VEC=1, REG_ITEMS=0) instead; when True it raises ValueError.
    After each call, `last_defines` holds the defines of the variant that ran.
    """

    def __init__(self, kind, source, name, defines, compile_fn=None, strict=False):
        if kind not in ("pointwise", "row_softmax", "row_reduce", "layernorm"):
            raise ValueError(f"unknown kernel kind {kind!r}")
        self.kind, self.source, self.name = kind, source, name
        self.defines = {k: int(v) for k, v in defines.items()}
        self.compile_fn = compile_fn
        self.strict = strict
        self.last_defines = None
        self._variants = {}

    def kernel(self, defines=None):
        """The loaded kernel for `defines` (default: self.defines), compiled on first use."""
        d = self.defines if defines is None else defines
        key = (torch.cuda.current_device(), tuple(sorted(d.items())))
        k = self._variants.get(key)
        if k is None:
            fn = self.compile_fn or nvrtc_compile
            cubin = fn(self.source, self.name, dict(d), arch_of())
            k = self._variants[key] = load_kernel(cubin, self.name)
        return k

    def _variant(self, n, ptrs_lds):
        d = dict(self.defines)
        vec = d.get("VEC", 1)
        ok_vec = n % vec == 0 and all(p % (4 * vec) == 0 for p in ptrs_lds[0]) and \
            all(ld % vec == 0 for ld in ptrs_lds[1])
        if self.kind != "pointwise" and not ok_vec:
            if self.strict:
                raise ValueError(f"VEC={vec} needs N % {vec} == 0 and {4 * vec}-byte aligned rows")
            d["VEC"] = 1
        cap = reg_capacity(d.get("THREADS", 256), d["VEC"] if "VEC" in d else 1,
                           d.get("WARP_ROW", 0), d.get("REG_ITEMS", 0))
        if d.get("REG_ITEMS", 0) > 0 and n > cap:
            if self.strict:
                raise ValueError(f"REG_ITEMS={d['REG_ITEMS']} holds N <= {cap}, got N={n}")
            d["REG_ITEMS"] = 0
        self.last_defines = d
        return d

    def __call__(self, *args, **kw):
        return getattr(self, "_run_" + self.kind)(*args, **kw)

    def _run_pointwise(self, *inputs, scalars=(), out=None, waves=4):
        if not inputs:
            raise ValueError("pointwise needs at least one input tensor")
        shape = inputs[0].shape
        for i, t in enumerate(inputs):
            _check(t, f"input {i}")
            if t.shape != shape:
                raise ValueError(f"input {i} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        ins = [t if t.is_contiguous() else t.contiguous() for t in inputs]
        if out is None:
            out = torch.empty(shape, device=ins[0].device, dtype=torch.float32)
        elif not out.is_contiguous() or out.shape != shape or out.dtype != torch.float32:
            raise ValueError("out must be a contiguous float32 tensor of the inputs' shape")
        n = out.numel()
        d = dict(self.defines)
        self.last_defines = d
        if n == 0:
            return out
        t, v, u = d.get("THREADS", 256), d.get("VEC", 1), d.get("UNROLL", 1)
        grid = pointwise_grid(n, t, v, u, sm_count(), waves)
        launch(self.kernel(d), grid, t, *ins, *[float(s) for s in scalars], out, n)
        return out

    def _row_prep(self, x, extra_ptrs=()):
        _check(x, "x")
        x2, m, n, ldx = _rows(x)
        return x2, m, n, ldx

    def _run_row_softmax(self, x, out=None):
        x2, m, n, ldx = self._row_prep(x)
        y = torch.empty((m, n), device=x.device, dtype=torch.float32) if out is None else out.view(m, n)
        if m == 0 or n == 0:
            return y.view(x.shape)
        d = self._variant(n, ([x2.data_ptr(), y.data_ptr()], [ldx, y.stride(0)]))
        t = d.get("THREADS", 256)
        launch(self.kernel(d), row_grid(m, t, d.get("WARP_ROW", 0)), t, x2, y, m, n, ldx, y.stride(0))
        return y.view(x.shape)

    def _run_row_reduce(self, x, out=None):
        x2, m, n, ldx = self._row_prep(x)
        y = torch.empty((m,), device=x.device, dtype=torch.float32) if out is None else out.view(m)
        if m == 0:
            return y.view(x.shape[:-1])
        if n == 0:
            raise ValueError("reduction over an empty dim")
        d = self._variant(n, ([x2.data_ptr()], [ldx]))
        t = d.get("THREADS", 256)
        launch(self.kernel(d), row_grid(m, t, d.get("WARP_ROW", 0)), t, x2, y, m, n, ldx)
        return y.view(x.shape[:-1])

    def _run_layernorm(self, x, weight=None, bias=None, eps=1e-5, out=None):
        x2, m, n, ldx = self._row_prep(x)
        for t, what, flag in ((weight, "weight", "HAS_WEIGHT"), (bias, "bias", "HAS_BIAS")):
            if (t is not None) != bool(self.defines.get(flag, 0)):
                raise ValueError(f"this kernel was built with {flag}={self.defines.get(flag, 0)}")
            if t is not None:
                _check(t, what)
                if t.numel() != n or not t.is_contiguous():
                    raise ValueError(f"{what} must be contiguous with {n} elements")
        y = torch.empty((m, n), device=x.device, dtype=torch.float32) if out is None else out.view(m, n)
        if m == 0 or n == 0:
            return y.view(x.shape)
        ptrs = [x2.data_ptr(), y.data_ptr()] + [t.data_ptr() for t in (weight, bias) if t is not None]
        d = self._variant(n, (ptrs, [ldx, y.stride(0)]))
        t = d.get("THREADS", 256)
        launch(self.kernel(d), row_grid(m, t, d.get("WARP_ROW", 0)), t,
               x2, weight, bias, y, m, n, ldx, y.stride(0), float(eps))
        return y.view(x.shape)
