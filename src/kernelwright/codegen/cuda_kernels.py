"""CUDA C++ kernels from the templates in templates/cuda: rendering, launchers, standalone code.

Rendering (no GPU, no cuda.core needed):
    render_pointwise(expr, inputs, ...)   -> CudaKernelSource
    render_row_softmax(log=..., ...)      -> CudaKernelSource
    render_row_reduce(op, ...)            -> CudaKernelSource
    render_layernorm(...)                 -> CudaKernelSource
A CudaKernelSource holds the CUDA source, the extern "C" kernel name, the -D knobs (`defines`)
and the launch geometry (`geometry(...)`). The knobs are macros, so one source serves every
variant; `variant(**knobs)` returns a copy with other knobs.

Launching (GPU only; cuda.core is imported lazily):
    PointwiseLauncher, RowSoftmaxLauncher, RowReduceLauncher, LayerNormLauncher, make_launcher
They compile through kernelwright.build (disk cache, resource usage) and launch on torch's
current stream via templates/cuda/runtime.py, the same file that emitted modules use.

Standalone emission (modules that run without kernelwright):
    write_runtime(out_dir)             copies runtime.py to out_dir/kw_cuda_runtime.py
    render_runtime_loader()            Python text defining _kw_cuda_runtime() (loads that file)
    render_standalone_launcher(spec, var)  Python text: the CUDA source and a ready kernel object
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import keyword
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from kernelwright.codegen.templating import cuda_template

RUNTIME_MODULE = "kw_cuda_runtime"
_TEMPLATES = ("pointwise.cu", "row_softmax.cu", "row_reduce.cu")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = {"out", "n", "i", "u", "r", "tid", "stride", "x", "y", "M", "N", "float", "int",
             "double", "long", "short", "char", "void", "const", "return", "if", "else", "for",
             "while", "do", "auto", "struct", "class", "static", "inline", "unsigned", "signed",
             "bool", "true", "false", "register", "volatile", "extern", "template", "typename"}
REDUCE_OPS = {"sum": 0, "mean": 1, "max": 2, "min": 3}


def _template_dir():
    return importlib.resources.files("kernelwright.codegen") / "templates" / "cuda"


def template_text(filename: str) -> str:
    """Raw text of a CUDA template (or runtime.py) shipped with kernelwright."""
    return (_template_dir() / filename).read_text()


def _render(template: str, **ctx) -> str:
    if not _IDENT.match(ctx["name"]):
        raise ValueError(f"kernel name {ctx['name']!r} is not a C identifier")
    return cuda_template(template).render(**ctx)


def _check_ident(name: str, what: str) -> None:
    if not _IDENT.match(name) or name in _RESERVED or keyword.iskeyword(name) \
            or name.startswith("kw_") or name.startswith("__"):
        raise ValueError(f"{what} {name!r} is not a usable C identifier here")


def _auto_name(prefix: str, *parts) -> str:
    h = hashlib.sha1(repr(parts).encode()).hexdigest()[:8]
    return f"kw_{prefix}_{h}"


def _check_threads(threads: int) -> None:
    if threads % 32 or not 32 <= threads <= 1024:
        raise ValueError(f"threads must be a multiple of 32 in [32, 1024], got {threads}")


@dataclass(frozen=True)
class CudaKernelSource:
    """A rendered kernel.

    kind     'pointwise' | 'row_softmax' | 'row_reduce' | 'layernorm'
    name     extern "C" kernel name
    source   CUDA C++ text
    defines  compile-time knobs passed as -D macros (THREADS, VEC, ...)
    meta     what was rendered in (expr, inputs, op, log, ...) for reports
    """

    kind: str
    name: str
    source: str
    defines: Mapping[str, int]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        return int(self.defines.get("THREADS", 256))

    def variant(self, **knobs) -> "CudaKernelSource":
        """The same source with other knob values, e.g. .variant(THREADS=512, VEC=1)."""
        d = dict(self.defines)
        for k, v in knobs.items():
            if k not in d:
                raise KeyError(f"{self.kind} has no knob {k}")
            d[k] = int(v)
        return replace(self, defines=d)

    def geometry(self, *shape: int, sms: int | None = None, waves: int = 4) -> tuple[int, int]:
        """(grid, block) for a launch: pointwise takes (numel,), row kernels take (M, N).
        `sms`: the GPU's multiprocessor count (default: `device_spec().sms`, the GPU this process
        sees, or the H200's without one)."""
        rt = runtime_module()
        t = self.threads
        if self.kind == "pointwise":
            (n,) = shape
            if sms is None:
                from kernelwright.analyze.device import device_spec

                sms = device_spec().sms
            return rt.pointwise_grid(n, t, self.defines["VEC"], self.defines["UNROLL"], sms, waves), t
        m = shape[0]
        return rt.row_grid(m, t, self.defines["WARP_ROW"]), t

    def compile(self, arch: str | None = None, cache_dir=None, options=None):
        """Build with NVRTC (kernelwright.build.compile_cuda); returns a CudaBuild."""
        from kernelwright.build import compile_cuda

        return compile_cuda(self.source, self.name, arch, self.defines, options=options,
                            cache_dir=cache_dir)


# ---- render ---------------------------------------------------------------------------------

def render_pointwise(expr: str, inputs: Sequence[str], scalars: Sequence[str] = (), *,
                     name: str | None = None, threads: int = 256, vec: int = 4,
                     unroll: int = 1) -> CudaKernelSource:
    """Elementwise kernel: out[i] = expr over fp32 inputs of one shape.

    expr     a C expression over the input names and scalar names (fp32), e.g.
             'fmaxf(a * s0 + b, 0.0f)'
    inputs   names of the tensor inputs, in kernel-argument order (at least one)
    scalars  names of fp32 scalar arguments, passed after the tensors
    threads  threads per block; vec 1 or 4 (float4 body + scalar tail); unroll >= 1
    Kernel arguments: (*inputs, *scalars, out, n).
    """
    inputs, scalars = list(inputs), list(scalars)
    if not inputs:
        raise ValueError("pointwise needs at least one input")
    for x in inputs:
        _check_ident(x, "input name")
    for s in scalars:
        _check_ident(s, "scalar name")
    if len(set(inputs + scalars)) != len(inputs) + len(scalars):
        raise ValueError("input and scalar names must be distinct")
    _check_threads(threads)
    if vec not in (1, 4) or unroll < 1:
        raise ValueError("vec must be 1 or 4 and unroll >= 1")
    name = name or _auto_name("pointwise", expr, inputs, scalars)
    src = _render("pointwise.cu", rows=False, name=name, expr=expr, inputs=inputs, scalars=scalars)
    return CudaKernelSource("pointwise", name, src,
                            {"THREADS": threads, "VEC": vec, "UNROLL": unroll},
                            {"expr": expr, "inputs": inputs, "scalars": scalars})


def _row_knobs(threads, vec, warp_row, reg_items):
    _check_threads(threads)
    if vec not in (1, 2, 4):
        raise ValueError("vec must be 1, 2 or 4")
    if reg_items < 0:
        raise ValueError("reg_items must be >= 0")
    return {"THREADS": threads, "VEC": vec, "WARP_ROW": int(bool(warp_row)),
            "REG_ITEMS": int(reg_items)}


def render_row_softmax(log: bool = False, *, name: str | None = None, threads: int = 256,
                       vec: int = 4, warp_row: bool = False, reg_items: int = 0,
                       online: bool = False, fast_exp: bool = False) -> CudaKernelSource:
    """softmax (log=False) or log_softmax (log=True) over the last dim of fp32 [M, N].

    warp_row   one warp per row (good for N up to ~1-2K) instead of one block per row
    reg_items  vectors per thread kept in registers (row read once) when N <= group*vec*reg_items
    online     single pass for max and sum (when not register-cached, 2 reads instead of 3)
    fast_exp   __expf instead of expf
    Kernel arguments: (x, y, M, N, ldx, ldy).
    """
    d = _row_knobs(threads, vec, warp_row, reg_items)
    d.update(ONLINE=int(bool(online)), LOG=int(bool(log)), FAST_EXP=int(bool(fast_exp)))
    name = name or ("kw_log_softmax" if log else "kw_softmax")
    src = _render("row_softmax.cu", rows=True, name=name, log=bool(log))
    return CudaKernelSource("row_softmax", name, src, d, {"log": bool(log)})


def render_row_reduce(op: str = "sum", *, name: str | None = None, threads: int = 256,
                      vec: int = 4, warp_row: bool = False,
                      reg_items: int = 0) -> CudaKernelSource:
    """op in sum/mean/max/min over the last dim of fp32 [M, N] -> [M].
    Kernel arguments: (x, y, M, N, ldx)."""
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {sorted(REDUCE_OPS)}")
    d = _row_knobs(threads, vec, warp_row, reg_items)
    d["OP"] = REDUCE_OPS[op]
    name = name or f"kw_row_{op}"
    src = _render("row_reduce.cu", rows=True, kind="reduce", name=name, op=op, op_code=REDUCE_OPS[op])
    return CudaKernelSource("row_reduce", name, src, d, {"op": op})


def render_layernorm(has_weight: bool = True, has_bias: bool = True, *, name: str | None = None,
                     threads: int = 256, vec: int = 4, warp_row: bool = False,
                     reg_items: int = 0, welford: bool = True) -> CudaKernelSource:
    """Layer norm over the last dim of fp32 [M, N] (biased variance, eps at launch).

    welford   True: one pass with Welford merges; False: two passes (mean, then squared
              deviations) over registers (reg_items > 0) or memory
    Kernel arguments: (x, weight, bias, y, M, N, ldx, ldy, eps)."""
    d = _row_knobs(threads, vec, warp_row, reg_items)
    d.update(WELFORD=int(bool(welford)), HAS_WEIGHT=int(bool(has_weight)),
             HAS_BIAS=int(bool(has_bias)))
    name = name or "kw_layernorm"
    src = _render("row_reduce.cu", rows=True, kind="layernorm", name=name, op="layernorm", op_code=0)
    return CudaKernelSource("layernorm", name, src, d,
                            {"has_weight": bool(has_weight), "has_bias": bool(has_bias)})


# ---- runtime and launchers ------------------------------------------------------------------

_RUNTIME = None


def runtime_module():
    """templates/cuda/runtime.py loaded as a module (imports torch and numpy; cuda.core lazily)."""
    global _RUNTIME
    if _RUNTIME is None:
        name = "kernelwright._cuda_runtime"
        res = _template_dir() / "runtime.py"
        with importlib.resources.as_file(res) as path:
            spec = importlib.util.spec_from_file_location(name, str(path))
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        _RUNTIME = mod
    return _RUNTIME


def _builder(cache_dir, options):
    from kernelwright.build import compile_cuda

    builds = []

    def fn(source, name, defines, arch):
        b = compile_cuda(source, name, arch, defines, options=options, cache_dir=cache_dir)
        builds.append(b)
        return b.cubin

    return fn, builds


class CudaLauncher:
    """Runs one CudaKernelSource on torch CUDA tensors (GPU only).

    spec       the rendered kernel (from a render_* function)
    cache_dir  cubin cache directory for kernelwright.build (None: default; False: off)
    options    extra NVRTC ProgramOptions fields (e.g. {'max_register_count': 64})
    strict     False: shapes that break a knob's precondition (VEC with N % VEC != 0 or
               misaligned rows, REG_ITEMS too small) run a safe variant (VEC=1, REG_ITEMS=0);
               True: raise ValueError instead
    Compiles on first call for the current device's arch; launches on the current torch stream.
    `builds` lists the CudaBuilds made (resources, compile seconds); `last_defines` the knobs
    of the variant that ran last.
    """

    kind = ""

    def __init__(self, spec: CudaKernelSource, *, cache_dir=None, options=None,
                 strict: bool = False):
        if self.kind and spec.kind != self.kind:
            raise ValueError(f"{type(self).__name__} runs {self.kind} kernels, not {spec.kind}")
        self.spec = spec
        fn, self.builds = _builder(cache_dir, options)
        self._k = runtime_module().CudaKernel(spec.kind, spec.source, spec.name,
                                              dict(spec.defines), compile_fn=fn, strict=strict)

    @property
    def last_defines(self):
        return self._k.last_defines


class PointwiseLauncher(CudaLauncher):
    """launcher(*inputs, scalars=(), out=None, waves=4) -> out

    inputs   fp32 CUDA tensors of one shape, in the order of spec.meta['inputs']
             (non-contiguous ones are copied to contiguous first)
    scalars  Python floats for spec.meta['scalars'], in order
    out      optional contiguous fp32 output of the same shape (allocated when None)
    waves    grid cap in full-occupancy waves (grid-stride loop covers the rest)"""

    kind = "pointwise"

    def __call__(self, *inputs, scalars=(), out=None, waves=4):
        if len(inputs) != len(self.spec.meta["inputs"]):
            raise ValueError(f"expected {len(self.spec.meta['inputs'])} inputs")
        if len(scalars) != len(self.spec.meta["scalars"]):
            raise ValueError(f"expected {len(self.spec.meta['scalars'])} scalars")
        return self._k(*inputs, scalars=scalars, out=out, waves=waves)


class RowSoftmaxLauncher(CudaLauncher):
    """launcher(x, out=None) -> softmax or log_softmax of x over its last dim

    x    fp32 CUDA tensor [..., N]; a 2-D view with unit last stride is used as is, anything
         else is made contiguous first
    out  optional contiguous fp32 tensor of x's shape"""

    kind = "row_softmax"

    def __call__(self, x, out=None):
        return self._k(x, out=out)


class RowReduceLauncher(CudaLauncher):
    """launcher(x, out=None) -> x reduced over its last dim (shape x.shape[:-1])

    x    fp32 CUDA tensor [..., N] (N >= 1)
    out  optional contiguous fp32 tensor of shape x.shape[:-1]"""

    kind = "row_reduce"

    def __call__(self, x, out=None):
        return self._k(x, out=out)


class LayerNormLauncher(CudaLauncher):
    """launcher(x, weight=None, bias=None, eps=1e-5, out=None) -> layer norm over the last dim

    x       fp32 CUDA tensor [..., N]
    weight  fp32 [N] contiguous; required iff the spec was rendered with has_weight
    bias    fp32 [N] contiguous; required iff the spec was rendered with has_bias
    eps     added to the variance
    out     optional contiguous fp32 tensor of x's shape"""

    kind = "layernorm"

    def __call__(self, x, weight=None, bias=None, eps=1e-5, out=None):
        return self._k(x, weight, bias, eps, out=out)


_LAUNCHERS = {c.kind: c for c in (PointwiseLauncher, RowSoftmaxLauncher, RowReduceLauncher,
                                  LayerNormLauncher)}


def make_launcher(spec: CudaKernelSource, **kw) -> CudaLauncher:
    """The launcher class for spec.kind (keyword arguments as CudaLauncher)."""
    return _LAUNCHERS[spec.kind](spec, **kw)


# ---- standalone emission --------------------------------------------------------------------

def runtime_source() -> str:
    return template_text("runtime.py")


def write_runtime(out_dir) -> Path:
    """Copy the runtime beside an emitted module as kw_cuda_runtime.py; returns its path."""
    p = Path(out_dir) / f"{RUNTIME_MODULE}.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(runtime_source())
    return p


def render_runtime_loader() -> str:
    """Python text defining `_kw_cuda_runtime()`, which loads kw_cuda_runtime.py from the
    emitted module's own folder (works whether the module is imported or exec'd from a path)."""
    return f'''
def _kw_cuda_runtime():
    """The CUDA runtime beside this file ({RUNTIME_MODULE}.py: torch + numpy + cuda.core)."""
    import importlib.util, os, sys
    mod = sys.modules.get("{RUNTIME_MODULE}")
    if mod is None:
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("{RUNTIME_MODULE}", os.path.join(here, "{RUNTIME_MODULE}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["{RUNTIME_MODULE}"] = mod
        spec.loader.exec_module(mod)
    return mod
'''.lstrip("\n")


def _py_string(text: str) -> str:
    if "'''" not in text and "\\" not in text and not text.endswith("'"):
        return "r'''" + text + "'''"
    return repr(text)


def render_standalone_launcher(spec: CudaKernelSource, var: str | None = None) -> str:
    """Python text that defines `_SRC_<VAR>` (the CUDA source) and `<VAR>`, a runtime
    CudaKernel ready to call like the launchers (e.g. VAR(x) for softmax). Needs the text of
    render_runtime_loader() earlier in the same module, and kw_cuda_runtime.py beside it."""
    var = var or spec.name.upper()
    if not _IDENT.match(var):
        raise ValueError(f"bad variable name {var!r}")
    defines = ", ".join(f"{k!r}: {int(v)}" for k, v in spec.defines.items())
    return (f"# CUDA kernel {spec.name} ({spec.kind}); knobs: {dict(spec.defines)}\n"
            f"_SRC_{var} = {_py_string(spec.source)}\n"
            f"{var} = _kw_cuda_runtime().CudaKernel({spec.kind!r}, _SRC_{var}, {spec.name!r}, "
            f"{{{defines}}})\n")
