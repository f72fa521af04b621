"""Schedule spaces of the fused group template (codegen/triton_group.py), from axes + constraints.

How many rows are too few, and how many programs a split reduction makes, follow the device's SM
count (`spec`: a `DeviceSpec`; default `device_spec()`, the GPU this process sees, or the H200's
numbers without one).
"""
from __future__ import annotations

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.space.axes import Axis, Space, next_pow2, pow2_range
from kernelwright.space.config import Config



def _warps_fit(c: dict) -> bool:
    """At least one element per thread and at most 64 per thread per live value."""
    tile = c["BLOCK_M"] * c.get("BLOCK_R", 1)
    per_thread = tile // (32 * c["num_warps"])
    return 1 <= per_thread <= 64


def _split_space(M: int, R: int, sms: int) -> list[Config]:
    """At least one program per SM and at most 16384 programs."""
    mp = next_pow2(M)
    # wide BLOCK_M with short BLOCK_R: rows side by side, for channels-last (strided) reductions
    # (64 / 128 rows: whole 128-byte lines of bf16 channels)
    return Space("triton.split", [Axis("BLOCK_M", [1, 2, 4, 8, 16, 32, 64, 128]),
                                  Axis("BLOCK_R", [32, 64, 128, 256, 512, 1024, 2048, 4096]),
                                  Axis("SPLIT", [32, 64, 128, 256, 512, 1024]), Axis("num_warps", [4, 8])],
                 [lambda c: sms <= M * c["SPLIT"] // c["BLOCK_M"] <= 16384 and c["BLOCK_M"] <= mp, _warps_fit],
                 fixed={"one_pass": False, "num_stages": 1}).configs()


def strided_long_rows(M: int, R: int, r_contiguous: bool, *, spec: DeviceSpec | None = None) -> bool:
    """Long rows whose elements are not contiguous in memory (a norm over channels-last data, a
    training batch norm over a [batch, features] matrix): a program must take ~32 rows side by side
    to read whole cache lines, which leaves fewer than two programs per SM unless each row is also
    split over several; rows of 4096+ elements are long enough to split, and both schedules are
    searched. (BatchNorm1d over a 8192 x 4096 GEMM output on the H200, rows 32 side by side, 128
    programs: 910 GB/s, 22% of its bandwidth; `7a60a35`.)"""
    spec = spec or device_spec()
    return not r_contiguous and R >= 4096 and not needs_split(M, R, spec=spec) and M < 2 * spec.sms * 32


def group_space(M: int, R: int, pointwise: bool, r_contiguous: bool = True, *,
                spec: DeviceSpec | None = None) -> list[Config]:
    """Candidate configs for a group with M kept indices and R reduced elements per row."""
    if pointwise:
        top = max(256, min(16384, next_pow2(M)))
        return Space("triton.pointwise", [Axis("BLOCK_M", pow2_range(256, top)), Axis("num_warps", [2, 4, 8, 16])],
                     [_warps_fit], fixed={"BLOCK_R": 1, "one_pass": False, "num_stages": 1}).configs()
    spec = spec or device_spec()
    rp = next_pow2(R)
    mp = next_pow2(M)
    if needs_split(M, R, spec=spec):
        return _split_space(M, R, spec.sms)
    configs: list[Config] = _split_space(M, R, spec.sms) if strided_long_rows(M, R, r_contiguous, spec=spec) else []
    # strided rows: neighbouring rows share cache lines, so a tile takes at least 16 of them (a
    # 32-byte sector of bf16); one row alone reads a line per element (KernelBench level-2 17's
    # instance norm over channels-last data on the H100: 2.0-4.1 ms in one-row tiles against 0.97
    # in 64 x 32 ones, `0e4bf65`)
    bm_min = 1 if r_contiguous else min(16, mp)
    # L2 eviction hints for multi-pass rows (first reads evict_last, last reads evict_first): on
    # the H200 they sped up two-pass rms/layer norm and 65536-wide log-softmax; a one-pass row's
    # evict_first loads measured slower, so one-pass configs carry none
    evict = Axis("EVICT", [False, True])
    if rp <= 16384:
        configs += Space("triton.row", [Axis("BLOCK_M", pow2_range(1, 128)), Axis("num_warps", [1, 2, 4, 8, 16])],
                         [lambda c: bm_min <= c["BLOCK_M"] <= mp and c["BLOCK_M"] * rp <= 16384, _warps_fit],
                         fixed={"BLOCK_R": rp, "one_pass": True, "num_stages": 1, "EVICT": False}).configs()
    if rp >= 32:
        configs += Space("triton.row", [Axis("BLOCK_M", pow2_range(1, 128)), Axis("BLOCK_R", pow2_range(16, min(rp // 2, 4096))),
                                        Axis("num_warps", [1, 2, 4, 8, 16]), evict],
                         [lambda c: bm_min <= c["BLOCK_M"] <= mp and 512 <= c["BLOCK_M"] * c["BLOCK_R"] <= 8192,
                          _warps_fit],
                         fixed={"one_pass": False, "num_stages": 1}).configs()
    return configs


def row_warps(tile: int) -> int:
    """Warps for a one-pass row tile of `tile` elements: at most 32 elements a thread."""
    return 4 if tile <= 2048 else 8 if tile <= 8192 else 16


def needs_split(M: int, R: int, *, spec: DeviceSpec | None = None) -> bool:
    """Too few rows to fill the GPU (fewer than two per SM) and long rows: split each row over many
    programs."""
    spec = spec or device_spec()
    return M < 2 * spec.sms and R >= 65536


def default_config(M: int, R: int, pointwise: bool, r_contiguous: bool = True, *,
                   spec: DeviceSpec | None = None) -> Config:
    """The documented heuristic used when nothing can be timed (CPU) and the cost model has no data:
    pointwise: 1024 elements and 4 warps per program; rows that fit 16384 elements: one pass (the row
    read once; on the H200 rms_norm's 8192-wide rows ran at 99% of copy bandwidth that way) with a
    tile of at least 2048 elements and at most 32 elements a thread; longer rows: 1024-element
    chunks; reductions over a strided (non-innermost) dim: 64 x 128 tiles with 4 warps, so
    neighbouring rows share coalesced loads and a program has 16 KiB of them in flight; few long
    rows, or long strided rows: a split reduction (about eight programs per SM over contiguous
    rows)."""
    if pointwise:
        return Config.make("triton.pointwise", BLOCK_M=1024, BLOCK_R=1, num_warps=4, one_pass=False, num_stages=1)
    spec = spec or device_spec()
    rp = next_pow2(R)
    if needs_split(M, R, spec=spec) or strided_long_rows(M, R, r_contiguous, spec=spec):
        split = min(1024, max(32, next_pow2(8 * spec.sms // max(M, 1))))
        if not r_contiguous:  # neighbouring rows are contiguous: read 64 of them side by side
            # 64 x 64 tiles, 4 warps, ~256 programs: the fastest of 192 configs for training BN
            # over NHWC (M=128, R=200704) on the H200, 1.75x as fast as 32 x 128 tiles with 8 warps
            # and eight programs per SM
            bm = min(64, next_pow2(M))
            split = min(1024, max(32, next_pow2(256 * bm // max(M, 1))))
            split = min(split, max(32, next_pow2(-(-R // 64))))  # no chunk shorter than its 64-row tile
            return Config.make("triton.split", BLOCK_M=bm, BLOCK_R=64, SPLIT=split, one_pass=False, num_warps=4,
                               num_stages=1)
        return Config.make("triton.split", BLOCK_M=1, BLOCK_R=2048, SPLIT=split, one_pass=False, num_warps=8, num_stages=1)
    if not r_contiguous:
        # 64 x 128 tiles with 4 warps (64 elements a thread): of 146 configs sampled at random on
        # KernelBench level-2 17's instance norm over channels-last bf16 data (M=16384, R=15876;
        # H100, `3408976`, docs/benchmarks.md "The strided-row norm sampled") the fastest,
        # 0.666 ms against 0.991 for 32 x 32 with 8 warps and torch.compile's 0.787: a program keeps
        # 16 KiB of loads in flight a step, where 2 KiB tiles left the bandwidth idle
        bm, br = min(64, next_pow2(M)), min(128, rp)
        return Config.make("triton.row", BLOCK_M=bm, BLOCK_R=br, one_pass=br >= R, num_warps=4, num_stages=1,
                           EVICT=False)
    if rp <= 16384:
        bm = max(1, min(next_pow2(M), 2048 // rp))
        return Config.make("triton.row", BLOCK_M=bm, BLOCK_R=rp, one_pass=True, num_warps=row_warps(bm * rp),
                           num_stages=1, EVICT=False)
    return Config.make("triton.row", BLOCK_M=1, BLOCK_R=1024, one_pass=False, num_warps=4, num_stages=1, EVICT=False)


def seed_configs(M: int, R: int, pointwise: bool, r_contiguous: bool = True, *,
                 spec: DeviceSpec | None = None) -> list[Config]:
    """Expert starting points tried before the model-based search, most different first: the
    heuristic default, a long-chunk streaming variant, the same two with L2 eviction hints, then
    neighbours in warps and rows per program (all inside the group's space)."""
    spec = spec or device_spec()
    base = default_config(M, R, pointwise, r_contiguous, spec=spec)
    space = set(group_space(M, R, pointwise, r_contiguous, spec=spec))
    out = [base]
    nw = base["num_warps"]
    if strided_long_rows(M, R, r_contiguous, spec=spec):
        # the split tile half as wide, then the row schedule: a channels-last conv's GELU + global
        # mean (M=8192, R=64516) on the H200 took 0.76 ms in 32 x 64 split tiles, 1.14 in 64 x 64 and
        # 2.47 in 32 x 32 rows (`803f7b4`, docs/benchmarks.md "KernelBench level-2 convolutions")
        row = Config.make("triton.row", BLOCK_M=min(32, next_pow2(M)), BLOCK_R=32, one_pass=False, num_warps=4,
                          num_stages=1, EVICT=False)
        narrow = base.replace(BLOCK_M=base["BLOCK_M"] // 2) if base["BLOCK_M"] > 1 else base
        out += [c for c in (narrow, row, base.replace(SPLIT=base["SPLIT"] * 2)) if c in space and c not in out]
    if base.template == "triton.split":
        variants = [base.replace(SPLIT=base["SPLIT"] // 2), base.replace(SPLIT=base["SPLIT"] * 2),
                    base.replace(BLOCK_R=4096), base.replace(num_warps=4)]
        if not r_contiguous:  # the runners-up of the same measurement
            variants = [base.replace(BLOCK_M=base["BLOCK_M"] // 2), base.replace(BLOCK_R=128, BLOCK_M=base["BLOCK_M"] // 2),
                        base.replace(BLOCK_M=base["BLOCK_M"] * 2, num_warps=8), base.replace(SPLIT=base["SPLIT"] * 2)]
        return out + [c for c in variants if c in space and c not in out]
    # long chunks streamed by 16 warps: the fastest softmax over 65536-wide rows measured on the H200
    chunk = min(4096, base["BLOCK_R"] // 2 if base["one_pass"] else 4096)
    streaming = base.replace(BLOCK_M=1, BLOCK_R=chunk, one_pass=False, num_warps=16 if chunk >= 4096 else 8)
    # torch.compile's reductions mark a row's first read evict_last and its last read evict_first
    variants = [streaming, base.replace(EVICT=True), streaming.replace(EVICT=True),
                base.replace(num_warps=nw * 2), base.replace(num_warps=max(1, nw // 2)),
                base.replace(BLOCK_M=base["BLOCK_M"] * 2), base.replace(BLOCK_M=base["BLOCK_M"] * 4, num_warps=nw * 2)]
    if not r_contiguous:
        # strided rows: no one-row streaming (a row's elements are a line apart; 2.0-4.1 ms on
        # KernelBench level-2 17's norm, H100, `0e4bf65`). The runners-up of the sample behind
        # the default (0.666 ms): half as many rows twice as long (0.688), 16 x 512 with 16 warps
        # (0.712), 32 x 128 with 8 (0.868), then the default with the eviction hints (0.689)
        variants = [base.replace(BLOCK_M=base["BLOCK_M"] // 2, BLOCK_R=base["BLOCK_R"] * 2),
                    base.replace(BLOCK_M=base["BLOCK_M"] // 4, BLOCK_R=base["BLOCK_R"] * 4, num_warps=16),
                    base.replace(BLOCK_M=base["BLOCK_M"] // 2, num_warps=8), base.replace(EVICT=True)]
    for c in variants:
        if c in space and c not in out:
            out.append(c)
    return out


def tiled_space() -> list[Config]:
    """Tiles for pointwise groups whose input and output disagree on the innermost dim
    (codegen/triton_group.transposed_walk): BLOCK_Q along the input's contiguous dim, BLOCK_P along
    the output's, 2..32 elements a thread."""
    return Space("triton.tiled", [Axis("BLOCK_Q", [8, 16, 32, 64]), Axis("BLOCK_P", [32, 64, 128]),
                                  Axis("num_warps", [2, 4, 8])],
                 [lambda c: 2 <= c["BLOCK_Q"] * c["BLOCK_P"] // (32 * c["num_warps"]) <= 32],
                 fixed={"TILED": True, "BLOCK_M": 1, "BLOCK_R": 1, "one_pass": False, "num_stages": 1}).configs()


def tiled_default() -> Config:
    """32 x 64 tiles with 4 warps (16 elements a thread): 128-byte rows on both sides."""
    return Config.make("triton.tiled", TILED=True, BLOCK_Q=32, BLOCK_P=64, num_warps=4, BLOCK_M=1, BLOCK_R=1,
                       one_pass=False, num_stages=1)
