"""Schedule space of the implicit-GEMM convolution template (templates/triton/conv.py.j2).

GEMM view of one convolution group: M output pixels, N output channels of the group, K input
channels of the group times kernel taps. The configs are tiles (BLOCK_M x BLOCK_N, BLOCK_K per
step), GROUP_M, num_warps and num_stages, filtered by the device's shared memory per block and
ordered for the search's seeds: tensor-core tiles first under tf32 / bf16, tiles no wider than
N and no deeper than K (rounded to powers of two), and enough tiles to fill the device's SMs.
"""
from __future__ import annotations

import itertools

from kernelwright.analyze.device import DeviceSpec, device_spec


def _p2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def conv_space(*, M: int, N: int, K: int, precision: str = "fp32", elem_bytes: int = 4,
               spec: DeviceSpec | None = None, max_configs: int = 40) -> list[dict]:
    """Candidate configs for one convolution (M, N, K: its per-group GEMM view), seed order first.

    `precision`: "fp32" (IEEE float32 FMAs: smaller tiles, more warps pay off less), "tf32" or
    "bf16" (tensor cores). `elem_bytes`: the operands' element size (shared-memory footprint of
    the num_stages-deep ring of A [BLOCK_M, BLOCK_K] and B [BLOCK_K, BLOCK_N] tiles).
    `spec`: the device (shared memory per block, SMs); default `device_spec()`."""
    spec = spec or device_spec()
    cap_n = max(16, min(256, _p2(N)))
    cap_k = max(16, min(128, _p2(K)))
    cap_m = max(16, min(256, _p2(M)))
    out = []
    for bm, bn, bk, warps, stages in itertools.product((32, 64, 128, 256), (16, 32, 64, 128, 256), (16, 32, 64, 128),
                                                      (2, 4, 8), (1, 2, 3, 4)):
        if bm > cap_m or bn > cap_n or bk > cap_k:
            continue
        smem = stages * (bm * bk + bk * bn) * elem_bytes
        if smem > spec.smem_per_block:
            continue
        elems = bm * bn  # accumulator elements per program: 16 to 128 per thread
        if not 16 * 32 * warps <= elems <= 128 * 32 * warps:
            continue
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages))
    tiles = lambda c: -(-M // c["BLOCK_M"]) * -(-N // c["BLOCK_N"])  # noqa: E731
    tensor_cores = precision in ("tf32", "bf16")
    best_k = 64 if precision == "bf16" else 32

    def rank(c):
        fills = tiles(c) >= spec.sms  # a full wave at least
        big = c["BLOCK_M"] * c["BLOCK_N"]
        return (not fills,
                # tensor cores: 128 x 128-class tiles, 4-8 warps, 3-4 stages; IEEE fp32: 64 x 64-class
                abs(big - (128 * 128 if tensor_cores else 64 * 64)) / big,
                abs(c["BLOCK_K"] - min(best_k, cap_k)),
                abs(c["num_stages"] - (3 if tensor_cores else 2)),
                abs(c["num_warps"] - (8 if big >= 128 * 128 else 4)))

    out.sort(key=rank)
    return out[:max_configs]


__all__ = ["conv_space"]
