"""build: CUDA C++ through NVRTC (cuda.core), cached by source hash, defines, arch and NVRTC
version; parallel compilation; registers / shared memory / spills of every build.
(Triton kernels are built by Triton's own JIT.)"""

from kernelwright.build.nvrtc import (
    DEFAULT_CACHE_DIR,
    STATS,
    BuildError,
    BuildFailure,
    CompileJob,
    CudaBuild,
    ResourceUsage,
    cache_key,
    compile_cuda,
    compile_many,
    default_arch,
    nvrtc_available,
    nvrtc_version,
    parse_ptxas_log,
    resource_usage,
)

__all__ = [
    "DEFAULT_CACHE_DIR", "STATS", "BuildError", "BuildFailure", "CompileJob", "CudaBuild",
    "ResourceUsage", "cache_key", "compile_cuda", "compile_many", "default_arch",
    "nvrtc_available", "nvrtc_version", "parse_ptxas_log", "resource_usage",
]
