"""Compile generated Triton kernels for a GPU target on a machine without a GPU.

The Triton interpreter runs kernels on the CPU but never lowers them, so an error that only the
compiler sees (a name used before it is defined in one branch of a template, a type the lowering
refuses, too much shared memory) would surface first on the GPU. `compile_module_for_target`
runs a generated module's `launch()` on meta tensors, records every kernel launch instead of
running it, and compiles each recorded launch with `triton.compile` down to a cubin for the
target architecture (default sm_90): no device and no driver needed.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
           torch.bool: "i1"}


@dataclass
class Launch:
    """One kernel launch recorded from a launcher: the JIT function, its arguments and options."""

    fn: object
    args: tuple
    kwargs: dict


@dataclass
class TargetBuild:
    """What compiling one launch produced: the kernel name, and an error or the cubin's resources."""

    kernel: str
    error: str | None
    shared_bytes: int | None = None
    warp_specialized: bool | None = None  # whether the TTGIR holds a warp-specialised region
    registers: int | None = None  # per thread, as ptxas allocated them (`resources=True` only)
    spill_bytes: int | None = None  # spill stores per thread, as ptxas reports them (`resources=True` only)


def ptxas_resources(ptx: str, arch: int = 90) -> tuple[int, int]:
    """(registers per thread, bytes of spill stores per thread) of a PTX kernel, from `ptxas -v` for
    sm_`arch` (Triton's own ptxas, the one its compiles run; "a" targets as Triton's PTX names
    them for sm_90 and up). RuntimeError when ptxas fails or reports no register count."""
    from triton import knobs

    ptxas = (knobs.nvidia.ptxas_blackwell if arch >= 100 else knobs.nvidia.ptxas).path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", src, "-o", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True, timeout=600)
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    if proc.returncode or regs is None:
        raise RuntimeError(f"ptxas -v failed: {' '.join(proc.stderr.split())[:300]}")
    spill = re.search(r"(\d+) bytes spill stores", proc.stderr)
    return int(regs[1]), int(spill[1]) if spill else 0


def _built(name: str, k, resources: bool = False, arch: int = 90) -> TargetBuild:
    build = TargetBuild(name, None, getattr(k.metadata, "shared", None),
                        "ttg.warp_specialize" in (getattr(k, "asm", None) or {}).get("ttgir", ""))
    if resources:
        build.registers, build.spill_bytes = ptxas_resources(k.asm["ptx"], arch)
    return build


class _Recorder:
    def __init__(self, fn, log: list):
        self.fn, self.log = fn, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(Launch(self.fn, args, kwargs))
        return launch


def record_launches(module, args: list) -> list[Launch]:
    """Call `module.launch(*args)` with every Triton kernel of the module replaced by a recorder."""
    from triton.runtime.jit import JITFunction

    log: list[Launch] = []
    saved = {k: v for k, v in vars(module).items() if isinstance(v, JITFunction)}
    try:
        for k, v in saved.items():
            setattr(module, k, _Recorder(v, log))
        module.launch(*args)
    finally:
        for k, v in saved.items():
            setattr(module, k, v)
    return log


def _arg_type(v) -> str:
    if isinstance(v, torch.Tensor):
        return "*" + _DTYPES[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    if v is None:
        return "constexpr"
    if hasattr(v, "block_shape") and isinstance(getattr(v, "base", None), torch.Tensor):  # a TensorDescriptor
        return f"tensordesc<{_DTYPES[v.base.dtype]}[{','.join(map(str, v.block_shape))}]>"
    raise TypeError(f"cannot type kernel argument {type(v).__name__}")


def _jit_specialised(fn, launch: Launch, target):
    """(signature, constexprs, attrs, options) of `launch` as Triton's JIT specialises a real call
    (an int equal to 1 becomes a constexpr, ints and pointers divisible by 16 carry that fact, as
    meta tensors' null pointers are), or None where this Triton lacks the JIT's binder."""
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        binder_of = create_function_from_signature
        backend = make_backend(target)
    except ImportError:
        return None
    # (an argument the kernel does not take raises here, as it would at a real launch)
    bound, specialization, options = binder_of(fn.signature, fn.params, backend)(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, dict(launch.kwargs), bound, specialization, options)
    return signature, constexprs, attrs, options


def compile_launch(launch: Launch, arch: int = 90, resources: bool = False) -> TargetBuild:
    """Compile one recorded launch for sm_`arch` (front end, TTGIR, LLVM, PTX and ptxas), with
    its arguments specialised as Triton's JIT specialises them on a GPU (`_jit_specialised`), so
    what compiles here is what a real launch compiles. `resources`: also the registers and spills
    ptxas allocates (`ptxas_resources`: ptxas a second time, with -v)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = launch.fn
    name = getattr(fn, "__name__", str(fn))
    target = GPUTarget("cuda", arch, 32)
    try:
        jit = _jit_specialised(fn, launch, target)
    except Exception as e:  # noqa: BLE001 - a launch the JIT would refuse is the result
        return TargetBuild(name, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if jit is not None:
        signature, constexprs, attrs, options = jit
        try:
            src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
            k = triton.compile(src, target=target, options=options.__dict__)
            return _built(name, k, resources, arch)
        except Exception as e:  # noqa: BLE001 - a compile error is the result
            msg = " ".join(str(e).split())
            return TargetBuild(name, f"{type(e).__name__}: {msg[:300]}")
    options = {k: launch.kwargs[k] for k in ("num_warps", "num_stages") if k in launch.kwargs}
    values = dict(zip(fn.arg_names, launch.args))
    values.update({k: v for k, v in launch.kwargs.items() if k in fn.arg_names})
    signature, constexprs = {}, {}
    for i, p in enumerate(fn.params):
        if p.name not in values:
            if p.default is inspect.Parameter.empty:
                return TargetBuild(name, f"no value for kernel parameter {p.name}")
            values[p.name] = p.default
        v = values[p.name]
        if p.is_constexpr or v is None:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = v
        else:
            signature[p.name] = _arg_type(v)
    try:
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        return _built(name, k, resources, arch)
    except Exception as e:  # noqa: BLE001 - a compile error is the result
        msg = " ".join(str(e).split())
        return TargetBuild(name, f"{type(e).__name__}: {msg[:300]}")


def meta_tensor(shape, stride, dtype) -> torch.Tensor:
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")


def compile_module_for_target(module, args: list, arch: int = 90, resources: bool = False) -> list[TargetBuild]:
    """Every kernel `module.launch(*args)` would launch, compiled for sm_`arch` (`resources`: with
    registers and spills). `args` are usually meta tensors (`meta_tensor`) shaped like the real
    inputs."""
    return [compile_launch(launch, arch, resources) for launch in record_launches(module, args)]


@contextlib.contextmanager
def _compiled_mode():
    """Import with @triton.jit making compilable JIT functions. Run in a process that never set
    TRITON_INTERPRET=1: Triton's own modules imported in interpreter mode (its standard library,
    gluon) cannot be compiled from later."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def compile_source_for_target(text: str, name: str, args: list, cache_dir, arch: int = 90,
                              resources: bool = False) -> list[TargetBuild]:
    """Import generated module text (a separate import from any interpreted one) and compile
    every kernel its launcher would launch on `args` for sm_`arch` (`resources`: with registers
    and spills)."""
    from kernelwright.build.pyload import load_module_from_source

    with _compiled_mode():
        module = load_module_from_source(text, f"{name}_sm{arch}", cache_dir)
        return compile_module_for_target(module, args, arch, resources)
