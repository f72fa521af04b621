"""Schedule spaces of the GEMM, GEMM + row-reduction, implicit-GEMM conv and depthwise conv
templates (codegen/triton_gemm.py renders them).

The ``*_space`` functions return candidate configs as plain dicts with the keys of
``CONFIG_KEYS`` (plus TMA / KMAJOR / PERSISTENT variants for the GEMM, ROWS / BLOCK_W for the
depthwise kernels), generated from axes and constraints (shared memory, registers per thread,
problem shape), with a few known-good Hopper configs first. Shared memory per block and the SM
count come from the device's `DeviceSpec` (default: `device_spec()`, the GPU this process sees,
or the H200's numbers without one); the depthwise spaces do not depend on the device.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, TypedDict

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.space.axes import next_pow2, tiles

if TYPE_CHECKING:
    from typing_extensions import Unpack

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")

# row-reduction modes of templates/triton/gemm_rowreduce.py.j2 (codegen/triton_gemm.py renders them
# into it): those whose output is [M, N] (a row in one tile); WHOLE_ROW: the modes that need a whole
# row in one tile ("tile" / "tile_row": the epilogue code reduces it)
ROW_REDUCE_MODES = ("sum", "mean", "max", "min", "logsumexp", "softmax", "log_softmax", "tile", "tile_row")
ROW_NORMALIZATIONS = ("softmax", "log_softmax", "tile")
WHOLE_ROW = ROW_NORMALIZATIONS + ("tile_row",)



def _cfg(bm, bn, bk, gm, w, s, sk) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, num_warps=w, num_stages=s, SPLIT_K=sk)


# Known-good Hopper configs (tile M, N, K, warps, stages), first in every space they fit.
_SEEDS = {
    "bf16": tiles("128x256x64/8/3 256x128x64/8/3 128x128x64/8/4 128x128x64/4/4 64x256x64/4/4 128x64x64/4/4"),
    "tf32": tiles("128x256x32/8/3 256x128x32/8/3 128x128x32/8/4 128x128x32/4/4 64x128x32/4/4 128x64x32/4/4"),
    "fp32": tiles("128x128x16/8/3 128x128x32/8/3 128x64x32/4/3 64x128x32/4/3 64x64x32/4/3 128x128x32/4/3"),
}


def _tile_space(
    precision: str,
    *,
    M: int | None,
    N: int | None,
    K: int | None,
    elem_bytes: int | None,
    max_configs: int,
    split_k: bool,
    smem_limit: int,
    num_sms: int,
    group_m: tuple[int, ...] = (8,),
) -> list[dict]:
    """Tile configs that fit `smem_limit` bytes of shared memory per block, ranked by tile size,
    K-step bytes, pipeline depth, padding waste and how well the tiles fill `num_sms` SMs; split-K
    only where the output has fewer tiles than SMs."""
    prec = "fp32" if precision in ("fp32", "ieee") else precision
    if prec not in _SEEDS:
        raise ValueError(f"unknown precision {precision!r}")
    eb = elem_bytes or (2 if prec == "bf16" else 4)
    axes = dict(
        BLOCK_M=(16, 32, 64, 128, 256),
        BLOCK_N=(16, 32, 64, 128, 256),
        BLOCK_K=(16, 32, 64, 128),
        GROUP_M=group_m,
        num_warps=(4, 8),
        num_stages=(2, 3, 4, 5),
        SPLIT_K=(1, 2, 4, 8) if split_k else (1,),
    )
    cap_m = max(16, next_pow2(M)) if M else 256
    cap_n = max(16, next_pow2(N)) if N else 256
    cap_k = max(16, next_pow2(K)) if K else 128
    small = (M is not None and M < 64) or (N is not None and N < 64)

    def ok(c: dict) -> bool:
        bm, bn, bk, w, s, sk = (c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SPLIT_K"))
        if bm > cap_m or bn > cap_n or bk > cap_k:
            return False
        if not 32 <= bk * eb <= 256 or (bk * eb < 64 and (K is None or K >= 64)):
            return False
        if s * (bm + bn) * bk * max(eb, 2) > smem_limit:
            return False
        per_thread = bm * bn / (32 * w)  # fp32 accumulators per thread
        if not 8 <= per_thread <= 128:
            return False
        if w == 8 and bm * bn < 128 * 128:
            return False
        if bm * bn < 64 * 64 and not small:
            return False
        if prec == "fp32" and s > 3:  # the FMA path gains nothing from deep pipelines
            return False
        if sk > 1:
            if M is None or N is None or K is None:
                return False
            tiles = math.ceil(M / bm) * math.ceil(N / bn)
            if tiles >= num_sms or tiles * sk > 2 * num_sms or K // sk < 4 * bk:
                return False
        return True

    def score(c: dict) -> float:
        bm, bn, bk, w, s, sk = (c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SPLIT_K"))
        sc = math.log2(min(bm * bn, 128 * 256))  # bigger tiles: more reuse
        sc -= 0.3 * abs(bm / bn - 1) if bm != bn else 0.0
        sc += {128: 1.0, 64: 0.6, 256: 0.3}.get(bk * eb, 0.0)
        sc -= 0.3 * abs(s - (3 if prec == "fp32" else 4))
        if M and N:
            tiles = math.ceil(M / bm) * math.ceil(N / bn) * sk
            waste = (M * N) / (math.ceil(M / bm) * bm * math.ceil(N / bn) * bn)
            sc += 4 * (waste - 1)
            waves = tiles / num_sms
            if waves < 1:
                sc -= 3 * (1 - waves)
            else:
                sc -= 1.5 * (math.ceil(waves) - waves) / math.ceil(waves)
        return sc

    names = list(axes)
    cands = [dict(zip(names, vals)) for vals in itertools.product(*axes.values())]
    cands = [c for c in cands if ok(c)]
    seeds = [_cfg(bm, bn, bk, group_m[0], w, s, 1) for bm, bn, bk, w, s in _SEEDS[prec]]
    seeds = [c for c in seeds if ok(c)]
    rest = sorted((c for c in cands if c not in seeds), key=score, reverse=True)
    out = []
    for c in seeds + rest:
        if c not in out:
            out.append(c)
        if len(out) >= max_configs:
            break
    if not out:  # tiny or odd problem: the smallest legal tile
        out = [_cfg(16, 16, 16 if eb >= 4 else 32, group_m[0], 4, 2, 1)]
    return out


class GemmShape(TypedDict, total=False):
    """The problem keywords of the GEMM spaces (each may be left out or None): the GEMM's M, N and K
    (tiles are limited to them; without them the space is shape-free), `elem_bytes` (operand bytes as
    loaded: default 2 for bf16, else 4; pass 4 for float32 tensors cast to bf16 in the kernel) and
    `spec` (the device: shared memory per block, SMs; default `device_spec()`)."""

    M: int | None
    N: int | None
    K: int | None
    elem_bytes: int | None
    spec: DeviceSpec | None


def _shape_tiles(precision: str, shape: GemmShape, *, max_configs: int, split_k: bool,
                 group_m: tuple[int, ...] = (8,)) -> tuple[list[dict], DeviceSpec]:
    """The tile configs of `shape` on its device (`_tile_space`), and that device."""
    unknown = set(shape) - GemmShape.__optional_keys__
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
    spec = shape.get("spec") or device_spec()
    tiles = _tile_space(precision, M=shape.get("M"), N=shape.get("N"), K=shape.get("K"),
                        elem_bytes=shape.get("elem_bytes"), max_configs=max_configs, split_k=split_k,
                        smem_limit=spec.smem_per_block, num_sms=spec.sms, group_m=group_m)
    return tiles, spec


def gemm_space(precision: str = "tf32", *, max_configs: int = 60, tma: bool = False, kmajor_copy: bool = False,
               persistent: bool = True, **shape: Unpack[GemmShape]) -> list[dict]:
    """Candidate GEMM configs for a precision policy (fp32 / tf32 / bf16) and, optionally, a
    problem shape (`GemmShape`: limits tiles to the shape, enables split-K when the output has too
    few tiles to fill the GPU's SMs). tma: the operands are K-major, so each tile
    config is offered with TMA loads first, then with pointer loads. kmajor_copy: they are not,
    but TF32 wgmma wants them so: each tile is offered first with the operands copied K-major in
    the launcher (a tiled transpose) and TMA loads, then with strided pointer loads. A tile config
    that makes at least two tiles per SM (split-K off) is then offered a third time, as a persistent
    TMA kernel: on the H200 it ran the bare 8192 x 4096 x 4096 bf16 GEMM in 0.40 ms against 0.46
    (one program per tile; cuBLAS 0.35), but with fused epilogues it was 14-17% slower under bf16
    (0.192 vs 0.164 ms) and within 2% under tf32 (docs/benchmarks.md, "Design choices and the
    measurements behind them"); `persistent=False` leaves it out.
    Warp specialization (the template's WARP_SPECIALIZE) is not offered:
    it moved times by -2..+2% there, and a bf16 bench never returned from a fused GEMM search
    (in-kernel operand cast + bias/ReLU epilogue) whose first candidate was warp-specialized."""
    space, spec = _shape_tiles(precision, shape, max_configs=max_configs, split_k=True)
    if not (tma or kmajor_copy):
        return space
    M, N = shape.get("M"), shape.get("N")
    first = dict(TMA=True, KMAJOR=True) if kmajor_copy else dict(TMA=True)

    def variants(c):
        tma_c = dict(c, **first)
        tiles = math.ceil(M / c["BLOCK_M"]) * math.ceil(N / c["BLOCK_N"]) if M and N else 0
        if not persistent or c["SPLIT_K"] != 1 or tiles < 2 * spec.sms:  # pays when programs walk several tiles
            return [tma_c, c]
        return [tma_c, c, dict(tma_c, PERSISTENT=True)]

    return [v for c in space for v in variants(c)][:max_configs]


def whole_row_block_n(N: int) -> int:
    """BLOCK_N of a tile holding whole rows of N columns: the next power of two >= N (>= 16, tl.dot's
    minimum), exactly N where N is a power of two >= 16 (a row viewed as segments needs that)."""
    return max(16, next_pow2(N))


def rowreduce_space(precision: str = "tf32", *, reduce: str = "sum", max_configs: int = 40, tma: bool = False,
                    **shape: Unpack[GemmShape]) -> list[dict]:
    """Configs for the GEMM + row-reduction template (GROUP_M and SPLIT_K fixed at 1; where a
    whole row must fit one tile, WHOLE_ROW, BLOCK_N is the next power of two >= N). One program
    owns BLOCK_M whole rows, so the grid is M / BLOCK_M programs: configs that fill the GPU's SMs
    in whole waves come first (M = 8192 on the H200: BLOCK_M = 64 runs 128 programs, nearly one
    full wave, 128 only 64), and the first four (the search's seeds) differ in BLOCK_M x num_warps
    where they can. With `tma` (both operands K-major) each tile also comes with TMA loads: the
    fourth seed is the first tile's (on the H200 TMA tiles ran 2-5% faster than the same tiles
    without; `d9d9823`, docs/benchmarks.md, "Design choices and the measurements behind them").
    The problem keywords are `GemmShape`'s."""
    space, spec = _shape_tiles(precision, shape, max_configs=1000, split_k=False, group_m=(1,))
    sms = spec.sms
    M, N = shape.get("M"), shape.get("N")
    if reduce in WHOLE_ROW and N:
        bn = whole_row_block_n(N)
        out = []
        for c in space:
            c = dict(c, BLOCK_N=bn)
            # at most 128 accumulator values per thread: the epilogue keeps more than one row-tile live
            if c["BLOCK_M"] * bn / (32 * c["num_warps"]) <= 128 and c not in out:
                out.append(c)
        space = out or [_cfg(16, bn, 32, 1, 8, 2, 1)]
    if M:
        def waves(c):  # the share of the last wave's SMs that have a program (1.0: full waves)
            programs = -(-M // c["BLOCK_M"])
            return programs / (-(-programs // sms) * sms)
        space = sorted(space, key=lambda c: -round(waves(c), 1))  # stable: expert order within
    seen: set[tuple[int, int]] = set()
    first: list[dict] = []
    for c in space:
        if len(first) < 4 and (c["BLOCK_M"], c["num_warps"]) not in seen:
            seen.add((c["BLOCK_M"], c["num_warps"]))
            first.append(c)
    rest = [c for c in space if c not in first]
    if not tma:
        return (first + rest)[:max_configs]
    seeds = first[:3] + [dict(first[0], TMA=True)]
    more = first[3:] + rest
    return (seeds + [dict(c, TMA=True) for c in first[1:3]]
            + [v for c in more for v in (c, dict(c, TMA=True))])[:max_configs]


def conv_space(
    precision: str = "tf32",
    *,
    batch: int | None = None,
    Cin: int | None = None,
    Cout: int | None = None,
    OH: int | None = None,
    OW: int | None = None,
    elem_bytes: int | None = None,
    max_configs: int = 40,
    spec: DeviceSpec | None = None,
) -> list[dict]:
    """Candidate configs for the implicit-GEMM conv2d template (GEMM view: M = batch*OH*OW,
    N = Cout, BLOCK_K steps over input channels, so it is capped by Cin). `spec`: the device
    (shared memory per block, SMs); default `device_spec()`."""
    spec = spec or device_spec()
    M = batch * OH * OW if batch and OH and OW else None
    return _tile_space(precision, M=M, N=Cout, K=Cin, elem_bytes=elem_bytes, max_configs=max_configs,
                       split_k=False, smem_limit=spec.smem_per_block, num_sms=spec.sms)


def depthwise_space(*, C: int | None = None, OW: int | None = None, max_configs: int = 30) -> list[dict]:
    """Configs for the direct depthwise conv: BLOCK_M output pixels (BLOCK_M // BLOCK_W rows of
    BLOCK_W columns) x BLOCK_N channels. BLOCK_W is the output width rounded up to a power of two
    (whole rows) or 32 (less masked-off waste when that rounding is large), at most BLOCK_M."""
    axes = dict(BLOCK_M=(32, 64, 128, 256, 512), BLOCK_N=(1, 2, 4, 8, 16, 32), num_warps=(1, 2, 4, 8))
    cap_n = next_pow2(C) if C else 32
    widths = sorted({next_pow2(OW) if OW else 64, 32})
    out = []
    for bm, bn, w in itertools.product(*axes.values()):
        elems = bm * bn
        if bn > cap_n or not 256 <= elems <= 4096 or not 2 <= elems / (32 * w) <= 32:
            continue
        for bw in sorted({min(bm, x) for x in widths}, reverse=True):
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=bw, BLOCK_K=1, GROUP_M=1, num_warps=w, num_stages=1,
                            SPLIT_K=1))
    # NCHW input: pixels are the contiguous axis, so long pixel tiles first, whole rows before 32-wide.
    out.sort(key=lambda c: (-(c["BLOCK_M"] >= 128), abs(c["BLOCK_M"] * c["BLOCK_N"] - 1024), c["num_warps"],
                            -c["BLOCK_W"]))
    return out[:max_configs]


def depthwise_rows_space(*, C: int | None = None, OW: int | None = None, KH: int = 3,
                         max_configs: int = 20) -> list[dict]:
    """Configs for the depthwise conv's row-streaming kernel (KH-row kernels, row stride and
    dilation 1): BLOCK_M columns x BLOCK_N channels x ROWS output rows per program; 1 to 16
    elements of a row tile per thread for 3 rows, fewer for taller kernels (each element has
    2 * KH - 1 float32 accumulators), whole rows (or 256 columns) first."""
    cap_n = min(next_pow2(C) if C else 4, 4)
    cap_m = max(32, min(256, next_pow2(OW) if OW else 128))
    per_thread = min(16, 80 // (2 * KH - 1))
    out = []
    for bm, bn, rows, w in itertools.product((32, 64, 128, 256), (1, 2, 4), (4, 8, 16), (1, 2, 4)):
        if bm > cap_m or bn > cap_n or not 1 <= bm * bn / (32 * w) <= per_thread:
            continue
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, ROWS=rows, BLOCK_K=1, GROUP_M=1, num_warps=w, num_stages=1,
                        SPLIT_K=1))
    out.sort(key=lambda c: (-c["BLOCK_M"], abs(c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"]) - 4),
                            abs(c["ROWS"] - 8), c["BLOCK_N"]))
    return out[:max_configs]


__all__ = [
    "CONFIG_KEYS", "ROW_REDUCE_MODES", "ROW_NORMALIZATIONS", "WHOLE_ROW", "GemmShape", "gemm_space", "rowreduce_space",
    "conv_space", "depthwise_space", "depthwise_rows_space", "whole_row_block_n",
]
