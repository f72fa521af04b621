"""CUDA C++ builds through NVRTC (cuda.core): cubin for one exact arch, a disk cache, parallel
compilation, and resource usage (registers, shared memory, spills) of every build.

Resource usage comes from ptxas's own report (`-v`, captured in the NVRTC log) on any machine;
on a GPU `resource_usage(build, device=True)` reads the loaded kernel's attributes instead, and
`cuobjdump --dump-resource-usage` is the last resort where that tool exists.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

DEFAULT_CACHE_DIR = Path("~/.cache/kernelwright/cuda")
LOG_HEAD_LINES = 25

# Counters for tests and reports: NVRTC compiles actually run, and disk-cache hits.
STATS = {"compiles": 0, "cache_hits": 0}
_STATS_LOCK = threading.Lock()


class BuildError(Exception):
    """A CUDA C++ source that NVRTC rejected (or that could not be compiled at all).

    `log` is the full NVRTC log; str(err) shows its first lines."""

    def __init__(self, name: str, arch: str, log: str, kind: str = "compile"):
        self.name, self.arch, self.log, self.kind = name, arch, log, kind
        head = "\n".join(log.strip().splitlines()[:LOG_HEAD_LINES])
        super().__init__(f"{kind} error in CUDA kernel {name!r} for {arch}:\n{head}")


@dataclass(frozen=True)
class ResourceUsage:
    """Per-thread registers, static shared memory per block (bytes), local memory per thread
    (bytes; stack frame + spills), spill stores/loads (bytes). `source` says where it came
    from: 'ptxas' (compile log), 'driver' (loaded kernel attributes) or 'cuobjdump'. None
    fields are unknown from that source."""

    registers: int | None
    shared_bytes: int | None
    local_bytes: int | None
    spill_stores: int | None = None
    spill_loads: int | None = None
    source: str = "ptxas"

    @property
    def spills(self) -> bool | None:
        if self.spill_stores is None and self.spill_loads is None:
            return None
        return bool((self.spill_stores or 0) + (self.spill_loads or 0))


@dataclass(frozen=True)
class CudaBuild:
    cubin: bytes
    name: str
    arch: str
    log: str
    seconds: float  # compile time of the NVRTC run that made the cubin (0 never means cached)
    source_hash: str
    defines: tuple = ()
    cached: bool = False  # True when served from the disk cache
    key: str = ""
    resources: ResourceUsage | None = None  # from ptxas -v; None if the log had no report
    ok = True  # (class attribute) compile_many results: CudaBuild.ok is True, BuildFailure.ok False

    def summary(self) -> dict:
        return {"name": self.name, "arch": self.arch, "seconds": round(self.seconds, 4),
                "cached": self.cached, "source_hash": self.source_hash,
                "defines": dict(self.defines),
                "resources": asdict(self.resources) if self.resources else None}


@dataclass(frozen=True)
class CompileJob:
    source: str
    name: str
    arch: str | None = None
    defines: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    tag: Any = None  # caller's label, copied into the result


@dataclass(frozen=True)
class BuildFailure:
    """A failed job of compile_many: errors are data. kind: 'compile', 'timeout', 'internal'."""

    job: CompileJob
    kind: str
    message: str
    log: str = ""
    seconds: float = 0.0

    ok = False


# ---- environment ----------------------------------------------------------------------------

def nvrtc_version() -> str:
    """'major.minor' of the NVRTC that cuda.core uses ('unknown' if it cannot be asked)."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # pragma: no cover - depends on the installation
        return "unknown"


def nvrtc_available() -> tuple[bool, str]:
    """(True, '') when cuda.core imports and NVRTC answers; else (False, reason)."""
    try:
        import cuda.core  # noqa: F401
        from cuda.core import Program, ProgramOptions  # noqa: F401
    except Exception as e:
        return False, f"cuda.core cannot be imported: {e}"
    v = nvrtc_version()
    if v == "unknown":
        return False, "NVRTC version could not be read"
    return True, ""


def default_arch() -> str:
    """'sm_XY' of the current GPU, or 'sm_90' without one."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:
        pass
    return "sm_90"


def _cache_root(cache_dir) -> Path | None:
    if cache_dir is False:
        return None
    if cache_dir is None:
        cache_dir = os.environ.get("KERNELWRIGHT_CUDA_CACHE") or DEFAULT_CACHE_DIR
    return Path(cache_dir).expanduser()


# ---- compile --------------------------------------------------------------------------------

def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _norm_defines(defines: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in (defines or {}).items()))


def cache_key(source: str, name: str, arch: str, defines=None, options=None) -> str:
    blob = json.dumps({"src": source_hash(source), "name": name, "arch": arch,
                       "defines": _norm_defines(defines), "nvrtc": nvrtc_version(),
                       "options": sorted((str(k), repr(v)) for k, v in (options or {}).items())})
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


_PTXAS_REGS = re.compile(r"Used\s+(\d+)\s+registers")
_PTXAS_SMEM = re.compile(r"(\d+)\s+bytes\s+smem")
_PTXAS_FRAME = re.compile(r"(\d+)\s+bytes stack frame,\s*(\d+)\s+bytes spill stores,\s*(\d+)\s+bytes spill loads")


def parse_ptxas_log(log: str, name: str | None = None) -> ResourceUsage | None:
    """Resource usage of kernel `name` (or the first kernel) from a `ptxas -v` report."""
    lines = log.splitlines()
    start = 0
    if name is not None:
        for i, ln in enumerate(lines):
            if "Compiling entry function" in ln and f"'{name}'" in ln:
                start = i
                break
    regs = smem = frame = st = ld = None
    for ln in lines[start:]:
        if "Compiling entry function" in ln and regs is not None:
            break
        m = _PTXAS_FRAME.search(ln)
        if m:
            frame, st, ld = (int(g) for g in m.groups())
        m = _PTXAS_REGS.search(ln)
        if m:
            regs = int(m.group(1))
            m2 = _PTXAS_SMEM.search(ln)
            smem = int(m2.group(1)) if m2 else 0
    if regs is None:
        return None
    return ResourceUsage(regs, smem, frame, st, ld, "ptxas")


def _options(arch: str, name: str, defines, options) -> Any:
    from cuda.core import ProgramOptions

    opts = {"std": "c++17"}
    opts.update(dict(options or {}))
    ptxas = opts.pop("ptxas_options", None) or []
    if isinstance(ptxas, str):
        ptxas = [ptxas]
    ptxas = list(ptxas)
    if "-v" not in ptxas:
        ptxas.append("-v")
    macros = [(k, v) for k, v in _norm_defines(defines)]
    return ProgramOptions(arch=arch, name=name, define_macro=macros or None,
                          ptxas_options=ptxas, **opts)


def compile_cuda(source: str, name: str, arch: str | None = None,
                 defines: Mapping[str, Any] | None = None, *,
                 options: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None | bool = None) -> CudaBuild:
    """Compile CUDA C++ `source` to a cubin for `arch` and check that it defines kernel `name`.

    arch      'sm_XY'; default: the current GPU, or 'sm_90' without one
    defines   -D macros, e.g. {'THREADS': 256, 'VEC': 4}
    options   extra cuda.core ProgramOptions fields (e.g. max_register_count=64,
              use_fast_math=True, ptxas_options=[...]); '-v' is always added for ptxas
    cache_dir a directory for the cubin cache (default ~/.cache/kernelwright/cuda, or
              $KERNELWRIGHT_CUDA_CACHE); False disables the cache
    Raises BuildError (with NVRTC's log) when the source does not compile.
    """
    arch = arch or default_arch()
    key = cache_key(source, name, arch, defines, options)
    root = _cache_root(cache_dir)
    shash = source_hash(source)
    if root is not None:
        hit = _cache_get(root, key)
        if hit is not None:
            cubin, meta = hit
            with _STATS_LOCK:
                STATS["cache_hits"] += 1
            res = ResourceUsage(**meta["resources"]) if meta.get("resources") else None
            return CudaBuild(cubin, name, arch, meta.get("log", ""), meta.get("seconds", 0.0),
                             shash, _norm_defines(defines), True, key, res)
    try:
        from cuda.core import Program
    except Exception as e:
        raise BuildError(name, arch, f"cuda.core cannot be imported: {e}", "environment") from e

    class _Log:
        def __init__(self):
            self.parts = []

        def write(self, s):
            self.parts.append(s if isinstance(s, str) else s.decode(errors="replace"))

    logbuf = _Log()
    t0 = time.perf_counter()
    try:
        opts = _options(arch, name, defines, options)
        obj = Program(source, code_type="c++", options=opts).compile("cubin", logs=logbuf)
    except Exception as e:  # NVRTCError carries the compilation log in its message
        msg = str(e)
        log = msg.split("compilation log:", 1)[1] if "compilation log:" in msg else msg
        raise BuildError(name, arch, log.strip("\x00 \n"), "compile") from e
    seconds = time.perf_counter() - t0
    with _STATS_LOCK:
        STATS["compiles"] += 1
    log = "".join(logbuf.parts).replace("\x00", "").strip()
    cubin = bytes(obj.code)
    if "Compiling entry function" in log:
        defined = f"entry function '{name}'" in log
    else:  # no ptxas report: look for the symbol in the ELF string table
        defined = b"\0" + name.encode() + b"\0" in cubin
    if not defined:
        raise BuildError(name, arch, f"kernel {name!r} is not defined by the source (is it "
                         f"extern \"C\" __global__?)\n{log}", "compile")
    res = parse_ptxas_log(log, name)
    if res is None and shutil.which("cuobjdump"):
        # cuda.core 1.2.0 / NVRTC 13.0 (the GPU machine) return an empty log when the same
        # program was compiled before in the process: read the cubin instead (no spill bytes).
        try:
            res = _cuobjdump_usage(shutil.which("cuobjdump"), cubin, name)
        except Exception:
            res = None
    build = CudaBuild(cubin, name, arch, log, seconds, shash, _norm_defines(defines), False,
                      key, res)
    if root is not None:
        _cache_put(root, key, build)
    return build


def _cache_get(root: Path, key: str):
    cub, meta = root / f"{key}.cubin", root / f"{key}.json"
    try:
        data = cub.read_bytes()
        m = json.loads(meta.read_text())
        if m.get("sha256") != hashlib.sha256(data).hexdigest():
            return None
        return data, m
    except (OSError, ValueError):
        return None


def _cache_put(root: Path, key: str, build: CudaBuild) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        meta = {"name": build.name, "arch": build.arch, "log": build.log,
                "seconds": build.seconds, "source_hash": build.source_hash,
                "defines": list(build.defines), "nvrtc": nvrtc_version(),
                "sha256": hashlib.sha256(build.cubin).hexdigest(),
                "resources": asdict(build.resources) if build.resources else None}
        for path, data in ((root / f"{key}.cubin", build.cubin),
                           (root / f"{key}.json", json.dumps(meta).encode())):
            fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written is not an error


# ---- many at once ---------------------------------------------------------------------------

def compile_many(jobs: Iterable[CompileJob | Mapping[str, Any]], max_workers: int | None = None,
                 timeout_s: float | None = 120.0,
                 cache_dir: str | os.PathLike | None | bool = None) -> list:
    """Compile jobs in parallel (threads: NVRTC releases the GIL). Returns, in job order, a
    CudaBuild (`.ok` True) or a BuildFailure (`.ok` False) per job; nothing raises.

    A job running longer than `timeout_s` is reported as a 'timeout' failure; its thread cannot
    be stopped and finishes in the background (its result is discarded)."""
    jobs = [j if isinstance(j, CompileJob) else CompileJob(**j) for j in jobs]
    if not jobs:
        return []
    workers = max_workers or min(len(jobs), os.cpu_count() or 1)
    results: list = [None] * len(jobs)
    started: dict[int, float] = {}

    def run(i: int):
        started[i] = time.perf_counter()
        j = jobs[i]
        return compile_cuda(j.source, j.name, j.arch, j.defines, options=j.options,
                            cache_dir=cache_dir)

    ex = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kw-nvrtc")
    try:
        futs = {ex.submit(run, i): i for i in range(len(jobs))}
        pending = set(futs)
        while pending:
            done, pending = cf.wait(pending, timeout=0.05, return_when=cf.FIRST_COMPLETED)
            for f in done:
                i = futs[f]
                t = time.perf_counter() - started.get(i, time.perf_counter())
                try:
                    results[i] = f.result()
                except BuildError as e:
                    results[i] = BuildFailure(jobs[i], e.kind, str(e), e.log, t)
                except Exception as e:  # pragma: no cover - unexpected
                    results[i] = BuildFailure(jobs[i], "internal", f"{type(e).__name__}: {e}", "", t)
            if timeout_s is not None:
                now = time.perf_counter()
                for f in list(pending):
                    i = futs[f]
                    if i in started and now - started[i] > timeout_s:
                        f.cancel()
                        pending.discard(f)
                        results[i] = BuildFailure(jobs[i], "timeout",
                                                  f"compile took over {timeout_s:.0f} s", "",
                                                  now - started[i])
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    return results


# ---- resource usage -------------------------------------------------------------------------

def resource_usage(build: CudaBuild, device: bool | None = None):
    """(ResourceUsage | None, reason). With device=True (default: when a GPU is present and the
    build's arch matches it) the cubin is loaded and the kernel's attributes are read; otherwise
    the ptxas report of the build is used, else `cuobjdump --dump-resource-usage` if present."""
    if device is None:
        device = default_arch() == build.arch and _gpu_present()
    if device:
        try:
            return _driver_usage(build), ""
        except Exception as e:
            reason = f"driver query failed: {type(e).__name__}: {e}"
        else:  # pragma: no cover
            reason = ""
    else:
        reason = ""
    if build.resources is not None:
        return build.resources, ""
    tool = shutil.which("cuobjdump")
    if tool:
        try:
            return _cuobjdump_usage(tool, build.cubin, build.name), ""
        except Exception as e:
            reason = (reason + "; " if reason else "") + f"cuobjdump failed: {e}"
    else:
        reason = (reason + "; " if reason else "") + "no ptxas report in the log and no cuobjdump"
    return None, reason


def _gpu_present() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _driver_usage(build: CudaBuild) -> ResourceUsage:
    from cuda.core import Device, ObjectCode

    Device().set_current()
    k = ObjectCode.from_cubin(build.cubin, name=build.name).get_kernel(build.name)
    a = k.attributes
    spills_st = build.resources.spill_stores if build.resources else None
    spills_ld = build.resources.spill_loads if build.resources else None
    return ResourceUsage(int(a.num_regs), int(a.shared_size_bytes), int(a.local_size_bytes),
                         spills_st, spills_ld, "driver")


_CUOBJ = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def _cuobjdump_usage(tool: str, cubin: bytes, name: str) -> ResourceUsage:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", str(p)], capture_output=True,
                             text=True, timeout=60).stdout
    part = out.split(name, 1)[1] if name in out else out
    m = _CUOBJ.search(part)
    if not m:
        raise ValueError(f"unexpected output: {out[:200]!r}")
    reg, stack, shared, local = (int(g) for g in m.groups())
    return ResourceUsage(reg, shared, max(stack, local), None, None, "cuobjdump")
