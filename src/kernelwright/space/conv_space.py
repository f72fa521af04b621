"""The schedule space of the implicit-GEMM convolution template (codegen/triton_conv.py,
templates/triton/conv.py.j2).

GEMM view per group: M output pixels, N output channels of the group, K = input channels of the
group x kernel taps. A config is a dict with the keys of `CONFIG_KEYS`: the tile (BLOCK_M pixels,
BLOCK_N output channels, BLOCK_K input channels per step, or (tap, channel) pairs where a group has
fewer channels than BLOCK_K), GROUP_M (rows of tiles walked together) and Triton's num_warps and
num_stages. Configs come in seed order: tensor-core shaped tiles known to run well on Hopper GEMMs
first (for tf32 and bf16), with BLOCK_N shrunk toward small N; then the rest of the product of the
axes, ranked by a score (tile reuse, K-step bytes, pipeline depth, padding waste, SM fill). Every
config fits the device's shared memory per block and, where the problem allows, makes enough
programs to occupy the device's SMs (`DeviceSpec`: no device numbers here).
"""
from __future__ import annotations

import itertools
import math

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.space.axes import next_pow2, tiles

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
# a box config's extra keys: the tile's output pixels as a BOX_D x BOX_H x BOX_W box of one image,
# read through tensor descriptors (the template's TMA path)
BOX_KEYS = ("BOX_D", "BOX_H", "BOX_W")
# a two-row box's extra key: its rows read as two one-row boxes into two accumulators (the template's
# TWO_ROWS), for the 256-pixel boxes of TWO_ROW_SEEDS
ROW_KEYS = ("TWO_ROWS",)
# a padded-grid config's extra key (the template's FLAT): a tile is BLOCK_M consecutive pixels of the
# zero-padded input's grid, each tap's input tile one 2-D descriptor box (`flat_configs`)
FLAT_KEYS = ("FLAT",)
# a split-K config's extra key: each tile's K steps shared among SPLIT_K programs (`split_k`)
SPLIT_KEYS = ("SPLIT_K",)
# a box config's warp-specialised K loop (the template's WARP_SPEC, 4 warps): it compiles into
# producer and consumer warps for sm_90, but its launches fault on the H100 (an illegal memory
# access; docs/benchmarks.md "Training layouts"), so no seed or search axis has it (only a config
# given to the template or to scripts/conv_check.py --extra-configs)
WARP_KEYS = ("WARP_SPEC",)
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the box configs, per precision, BLOCK_N shrunk to
# the problem's cap: the fastest tiles of the TMA probe on eight level-2 / ResNet shapes (3x3, stride 1,
# tf32 and bf16; docs/benchmarks.md "The convolution's input through tensor descriptors")
BOX_SEEDS = {
    "tf32": tiles("128x128x32/8/3 128x64x32/4/3 128x128x32/8/4 64x128x32/4/3"),
    "bf16": tiles("128x128x64/8/3 128x64x64/4/3 128x128x64/4/3 64x128x64/4/3"),
}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of a box config tried first, per precision, on a box of
# two rows where one pads the output no more than the box `best_box` picks (whose ties go to one long
# row). Under bf16 on an H100 (`232d929`, docs/benchmarks.md "... the box path's space sampled"), of
# the 46 configs of KernelBench level-2 #1's convolution that ran (126 x 126 outputs, 64 -> 128
# channels, a float32 input) 128 x 128 x 64 at 4 warps and 3 stages on a 2 x 64 box was fastest, 1.043 ms, against
# 1.357 for the first seed below on a 1 x 128 box; a two-row read of the same box (TWO_ROWS, K steps
# of 32) 1.050
TWO_ROW_BOX_FIRST = {
    "bf16": tiles("128x128x64/4/3"),
}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the two-row box configs, per precision, where the
# output's rows are wide enough for a 256-pixel box of two rows: a third fewer operand bytes per FLOP
# than a 128 x 128 tile. On an H100 (`fc7cd46`, docs/benchmarks.md "The batch-norm backward and
# two-row boxes") the 4-stage one ran KernelBench level-2 #1's convolution 4% faster than the 128-pixel
# box and the 3-stage one #54's 5% slower: tried after the probe's fastest box (under bf16, untimed,
# after the second box too)
TWO_ROW_SEEDS = {
    "tf32": tiles("256x128x32/8/4"),
    "bf16": tiles("256x128x64/8/3"),
}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the padded-grid configs, per precision, BLOCK_N
# and BLOCK_K shrunk to the problem's caps: the GEMM template's Hopper tiles
FLAT_SEEDS = {
    "tf32": tiles("128x128x32/8/4 128x256x32/8/3 128x64x32/4/4"),
    "bf16": tiles("128x128x64/8/4 128x256x64/8/3 128x64x64/4/4"),
}
# where the padded-grid configs enter the order of a space asked for them (flat=True): after its
# first FLAT_AFTER configs, then one before each of the next. The search's units do not ask: on an
# H100 (`eafcae1`, docs/benchmarks.md "Padded-grid convolution tiles") the best of them ran 1.13-1.29x
# slower than the space's first box config on all four shapes timed (tf32 and bf16, 2-D and 3-D),
# though both operands stay in shared memory; the path is there for explicit configs and probes
# (scripts/conv_check.py --flat)
FLAT_AFTER = 2
# outputs of at least this many pixels (batch x output spatial) take their first two box configs
# before the first gather config: on every such shape timed the box configs beat the gathers of
# the same tiles, 1.09-2.5x (s17 and s11 of KernelBench level-2 #1 / #54, 32 x 224 x 224, 128 x 64 x 64,
# a 3-D 16 x 32 x 64 x 64, stride-2 transposed ones; tf32 and bf16; docs/benchmarks.md sections "The
# convolution's input through tensor descriptors", "The convolution template's first configs",
# "The batch-norm backward and two-row boxes on the H100", "Padded-grid convolution tiles", "The box
# path's input copy in the dots' dtype"), or tied them, and the
# second box config was the faster of the two on s17 (the two-row box under tf32, 128 x 64 under
# bf16); smaller outputs keep one box, then one gather (where a gather won: 32 x 56 x 56, 14 x 14)
BOXES_FIRST_PIXELS = 1 << 19

AXES = dict(
    BLOCK_M=(32, 64, 128, 256),
    BLOCK_N=(16, 32, 64, 128, 256),
    BLOCK_K=(16, 32, 64, 128),
    GROUP_M=(8,),
    num_warps=(4, 8),
    num_stages=(2, 3, 4, 5),
)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) tried first, per precision; BLOCK_N and BLOCK_K
# are shrunk to the problem's caps before use (so a small N still starts from a big pixel tile)
SEEDS = {
    "bf16": tiles("128x128x64/8/4 128x256x64/8/3 128x128x64/4/4 256x128x64/8/3 64x128x64/4/4 128x64x64/4/4"),
    "tf32": tiles("128x128x32/8/4 128x256x32/8/3 128x128x32/4/3 256x128x32/8/3 64x128x32/4/4 128x64x32/4/4"),
    "fp32": tiles("128x128x16/8/3 128x64x32/4/3 64x128x32/4/3 128x128x32/8/3 64x64x32/4/3"),
}
PRECISIONS = {"fp32": "fp32", "ieee": "fp32", "tf32": "tf32", "bf16": "bf16"}



def smem_bytes(cfg: dict, elem_bytes: int) -> int:
    """Shared memory a config needs: its pipeline's A and B tiles (num_stages of them), or the
    float32 output tile the epilogue's layout change may stage, whichever is larger (the two are
    not live at once)."""
    bm, bn, bk, s = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"]
    return max(s * (bm + bn) * bk * elem_bytes, bm * bn * 4)


def block_k_cap(K: int | None, channels: int | None) -> int:
    """The largest BLOCK_K worth trying: the group's input channels (one tap's K run) rounded up to a
    power of two, at least 16 (tl.dot's minimum), and at most K rounded so. Fewer than 16 channels
    always fold taps into K (flat (tap, channel) steps), where up to 64 K elements per step cut the
    loop's trips."""
    cap = 128
    if channels:
        cap = min(cap, max(16, next_pow2(channels)) if channels >= 16 else 64)
    if K:
        cap = min(cap, max(16, next_pow2(K)))
    return cap


def programs(cfg: dict, M: int, N: int, groups: int = 1) -> int:
    """Programs the kernel launches (per phase class of a transposed convolution)."""
    return math.ceil(M / cfg["BLOCK_M"]) * math.ceil(N / cfg["BLOCK_N"]) * groups


def conv_space(
    *,
    M: int | None,
    N: int | None,
    K: int | None,
    precision: str,
    elem_bytes: int | None,
    spec: DeviceSpec | None,
    max_configs: int = 40,
    channels: int | None = None,
    groups: int = 1,
    min_block_m: int = 1,
    whole_n: bool = False,
    box_out: tuple[int, int, int] | None = None,
    box_window: tuple[int, int, int] = (1, 1, 1),
    flat: bool = False,
    box_elem_bytes: int | None = None,
) -> list[dict]:
    """Configs for the convolution template, seeds first.

    M: output pixels (batch x output spatial); N: output channels per group; K: input channels
    per group x kernel taps (None where unknown). precision: fp32 (or ieee), tf32 or bf16.
    elem_bytes: operand bytes as loaded (default 2 for bf16, else 4; pass 4 for float32 tensors the
    kernel rounds to bf16). spec: the device (shared memory per block, SMs; None: `device_spec()`).
    channels: input channels per group, which cap BLOCK_K (`block_k_cap`); groups: the number of
    groups, programs run side by side (both optional). min_block_m: the smallest BLOCK_M (a fused
    pooling window's size, so that a tile holds whole windows). whole_n: one tile spans all N channels
    (an epilogue that reduces over them): BLOCK_N is N rounded up to a power of two, and there is no
    config when that exceeds 256. box_out: the output's (D, H, W) (1 for missing dims) where the
    template's tensor-descriptor path applies (stride 1, one group, tf32 / bf16 operands whose channel
    rows are 16-byte multiples): `box_configs` alternate with the others, a box first; box_window:
    the (D, H, W) every box side is a multiple of (a fused pool's window, powers of two). flat: the
    template's padded-grid path applies (a convolution of stride 1, one group, tf32 / bf16, no fused
    pool or input prologue): `flat_configs` come after the first `FLAT_AFTER` configs, one before
    each of the next. box_elem_bytes: the box configs' operand bytes where they differ from
    elem_bytes (default elem_bytes): under bf16, launch copies an NCHW float32 input channels-last
    in bf16 for them and rounds the weights once, so their tiles hold 2-byte operands."""
    if whole_n and N and N > AXES["BLOCK_N"][-1]:
        return []
    prec = PRECISIONS.get(precision)
    if prec is None:
        raise ValueError(f"unknown precision {precision!r}; one of {sorted(PRECISIONS)}")
    spec = spec or device_spec()
    eb = elem_bytes or (2 if prec == "bf16" else 4)
    cap_m = max(32, next_pow2(M)) if M else 256
    cap_n = max(16, next_pow2(N)) if N else 256
    cap_k = block_k_cap(K, channels)
    small = bool((M and M < 64) or (N and N < 64))

    def ok(c: dict, eb: int = eb) -> bool:
        bm, bn, bk, w, s = (c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"))
        if bm > max(cap_m, min_block_m) or bn > cap_n or bk > cap_k or bm < min_block_m:
            return False
        if whole_n and bn != cap_n:
            return False
        if bk * eb > 256 or smem_bytes(c, eb) > spec.smem_per_block:
            return False
        if not 8 <= bm * bn / (32 * w) <= 128:  # float32 accumulators per thread
            return False
        if w == 8 and bm * bn < 128 * 128:
            return False
        if bm * bn < 64 * 64 and not small:
            return False
        return prec != "fp32" or s <= 3  # the FMA path gains nothing from deep pipelines

    def score(c: dict) -> float:
        bm, bn, bk, s = (c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"))
        sc = math.log2(min(bm * bn, 128 * 256))  # bigger tiles: more reuse
        sc -= 0.3 * abs(math.log2(bm / bn))
        sc += {128: 1.0, 64: 0.6, 256: 0.3}.get(bk * eb, 0.0)
        sc -= 0.3 * abs(s - (3 if prec == "fp32" else 4))
        if M and N:
            sc += 4 * ((M * N) / (math.ceil(M / bm) * bm * math.ceil(N / bn) * bn) - 1)  # padding waste
            waves = programs(c, M, N, groups) / max(1, spec.sms)
            sc -= 3 * (1 - waves) if waves < 1 else 1.5 * (math.ceil(waves) - waves) / math.ceil(waves)
        return sc

    def cfg(bm, bn, bk, w, s) -> dict:
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=AXES["GROUP_M"][0], num_warps=w, num_stages=s)

    seeds = []
    for bm, bn, bk, w, s in SEEDS[prec]:
        bm, bn, bk = max(bm, min_block_m), cap_n if whole_n else min(bn, cap_n), min(bk, cap_k)
        if w == 8 and bm * bn < 128 * 128:
            w = 4
        c = cfg(bm, bn, bk, w, s)
        if ok(c) and c not in seeds:
            seeds.append(c)
    seeds = _distinct_tiles_first(seeds)
    cands = [dict(zip(AXES, v)) for v in itertools.product(*AXES.values())]
    rest = sorted((c for c in cands if ok(c) and c not in seeds), key=score, reverse=True)
    out = seeds + rest
    if M and N and out:  # enough programs for the SMs where some config has them
        want = min(spec.sms, max(programs(c, M, N, groups) for c in out))
        filled = [c for c in out if programs(c, M, N, groups) >= want]
        out = filled + [c for c in out if c not in filled] if len(filled) < 4 else filled
    if not out:  # tiny or odd problem: the smallest legal tile
        out = [cfg(max(32, next_pow2(min_block_m)), cap_n if whole_n else 16, 16, 4, 2)]
    if box_out is not None and prec in BOX_SEEDS:
        # box and gather configs alternate: boxes win on large outputs and lose on small ones (where
        # host-side descriptor set-up and short rows cost more than the gathers), so a search of any
        # budget >= 2 times both
        beb = box_elem_bytes or eb
        boxes = [c for c in box_configs(box_out, prec, cap_n, cap_k, whole_n, spec, beb, box_window) if ok(c, beb)]
        rest = [c for c in out if c not in boxes]
        mixed = [c for pair in itertools.zip_longest(boxes, rest[:len(boxes)]) for c in pair if c is not None]
        if M and M >= BOXES_FIRST_PIXELS and len(boxes) > 1 and len(mixed) > 2:
            mixed[1], mixed[2] = mixed[2], mixed[1]  # (two boxes, then the first gather)
        out = mixed + rest[len(boxes):]
    if flat and prec in FLAT_SEEDS:
        # (the padded copy holds the dots' dtype: bf16 operands of float32 tensors take 2 bytes)
        flats = [c for c in flat_configs(prec, cap_n, cap_k, whole_n) if ok(c, 2 if prec == "bf16" else eb)]
        rest = [c for c in out if c not in flats]
        head, rest = rest[:FLAT_AFTER], rest[FLAT_AFTER:]
        out = head + [c for pair in itertools.zip_longest(flats, rest[:len(flats)]) for c in pair if c is not None] \
            + rest[len(flats):]
    if M and N and K:  # each of the first configs with too few tiles for the SMs, split along K next to it
        first = []
        for c in out[:4]:
            s = split_k(c, M, N, K, groups, spec)
            first += [c, dict(c, SPLIT_K=s)] if s > 1 else [c]
        out = first + out[4:]
    return out[:max_configs]


def flat_configs(precision: str, cap_n: int, cap_k: int, whole_n: bool) -> list[dict]:
    """The padded-grid configs of `FLAT_SEEDS[precision]`, BLOCK_N and BLOCK_K shrunk to the caps
    (8 warps only for tiles of at least 128 x 128)."""
    out = []
    for bm, bn, bk, w, s in FLAT_SEEDS[precision]:
        bn, bk = cap_n if whole_n else min(bn, cap_n), min(bk, cap_k)
        if w == 8 and bm * bn < 128 * 128:
            w = 4
        c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=AXES["GROUP_M"][0], num_warps=w, num_stages=s, FLAT=True)
        if c not in out:
            out.append(c)
    return _distinct_tiles_first(out)


def split_k(cfg: dict, M: int, N: int, K: int, groups: int, spec: DeviceSpec) -> int:
    """How many programs share each tile's K steps (a power of two up to 16; 1: none): where the
    config's tiles fill at most half the SMs, the most splits that keep the programs within one
    wave and give each split at least 4 K steps (a late ResNet layer at a small batch: 98 output
    pixels, 512 channels, K = 4608 make 4 tiles of 128 x 128)."""
    tiles = programs(cfg, M, N, groups)
    steps = math.ceil(K / cfg["BLOCK_K"])
    split = 1
    while split < 16 and tiles * split * 2 <= spec.sms and steps >= 8 * split:
        split *= 2
    return split


def _distinct_tiles_first(seeds: list[dict]) -> list[dict]:
    """`seeds` with those whose tile repeats an earlier seed's (after the shrinking toward a small N,
    only warps or stages differ) moved after the distinct tiles, so that a search of two or three
    trials compares tile shapes rather than pipeline depths."""
    first: dict[tuple, dict] = {}
    for c in seeds:
        first.setdefault((c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]), c)
    return list(first.values()) + [c for c in seeds if c not in first.values()]


def best_box(out: tuple[int, int, int], pixels: int, window: tuple[int, int, int] = (1, 1, 1)) -> tuple[int, int, int] | None:
    """The (BOX_D, BOX_H, BOX_W) of `pixels` output pixels (powers of two), each side a multiple of
    `window`'s (a fused pool's), that covers the output (D, H, W) with the fewest padded pixels;
    ties go to the widest box (longer contiguous rows). None where no box holds whole windows."""
    cands = _box_shapes(pixels, window)
    if not cands:
        return None
    fits = [b for b in cands if all(x <= max(next_pow2(o), k) for x, o, k in zip(b[:2], out, window))
            and b[2] <= max(16, next_pow2(out[2]), window[2])
            and b[2] >= min(16, pixels)]  # rows of 8 pixels ran slower than any wider box in the probe
    widest = max(b[2] for b in cands)
    return min(fits or [b for b in cands if b[2] == widest],
               key=lambda b: (round(_padded(out, b) / math.prod(out), 6), -b[2], -b[1]))


def _box_shapes(pixels: int, window: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Every (D, H, W) box of `pixels` pixels with D and H powers of two (D up to 8, H up to 32) whose
    sides are multiples of `window`'s."""
    boxes = [(d, h, pixels // (d * h)) for d in (1, 2, 4, 8) for h in (1, 2, 4, 8, 16, 32) if pixels % (d * h) == 0]
    return [b for b in boxes if all(x % k == 0 for x, k in zip(b, window))]


def _padded(out: tuple[int, int, int], box: tuple[int, int, int]) -> int:
    """The pixels `out` holds once each side is rounded up to a multiple of the box's."""
    return math.prod(math.ceil(o / x) * x for o, x in zip(out, box))


def _two_row_box(out: tuple[int, int, int], pixels: int, window: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """The box of `pixels` pixels in two rows (along H, or along D where the output has one row) that
    pads `out` no more than `best_box`'s, with rows of at least 16 pixels; None where there is none."""
    best = best_box(out, pixels, window)
    two = (1, 2, pixels // 2) if out[1] > 1 else (2, 1, pixels // 2)
    if best is None or pixels // 2 < 16 or any(x % k for x, k in zip(two, window)):
        return None
    return two if _padded(out, two) <= _padded(out, best) else None


def box_configs(out: tuple[int, int, int], precision: str, cap_n: int, cap_k: int, whole_n: bool,
                spec: DeviceSpec, elem_bytes: int, window: tuple[int, int, int] = (1, 1, 1)) -> list[dict]:
    """The box configs of `BOX_SEEDS[precision]` for an output of (D, H, W) pixels per image, each
    with the box of its BLOCK_M that pads the output least and holds whole `window`s, after
    `TWO_ROW_BOX_FIRST[precision]`'s on a box of two rows where that pads no more (`_two_row_box`). bf16
    multi-row boxes stay at 4 warps: on Triton 3.6 their 8-warp kernels computed wrong results in
    the probe (the same docs section). Then `TWO_ROW_SEEDS`' configs, second, where the best box
    of their BLOCK_M is two rows of at least 64 pixels (TWO_ROWS: no two-row box's reshape)."""
    seeds = []
    first = [(t, True) for t in TWO_ROW_BOX_FIRST.get(precision, ())]
    for (bm, bn, bk, w, s), two_rows in first + [(t, False) for t in BOX_SEEDS[precision]]:
        bn, bk = cap_n if whole_n else min(bn, cap_n), min(bk, cap_k)
        box = _two_row_box(out, bm, window) if two_rows else best_box(out, bm, window)
        if box is None:
            continue
        if w == 8 and (bm * bn < 128 * 128 or (precision == "bf16" and box[0] * box[1] > 1)):
            w = 4
        c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=AXES["GROUP_M"][0], num_warps=w, num_stages=s,
                 BOX_D=box[0], BOX_H=box[1], BOX_W=box[2])
        if c not in seeds and smem_bytes(c, elem_bytes) <= spec.smem_per_block:
            seeds.append(c)
    seeds = _distinct_tiles_first(seeds)
    for bm, bn, bk, w, s in TWO_ROW_SEEDS.get(precision, ()):
        bn, bk = cap_n if whole_n else min(bn, cap_n), min(bk, cap_k)
        box = best_box(out, bm, window)
        if box is None or box[0] * box[1] != 2 or box[2] < 64 or bm * bn < 128 * 128:
            continue  # (rows narrower than 64 pixels: a warp group's tile of the dot)
        c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=AXES["GROUP_M"][0], num_warps=w, num_stages=s,
                 BOX_D=box[0], BOX_H=box[1], BOX_W=box[2], TWO_ROWS=1)
        if smem_bytes(c, elem_bytes) <= spec.smem_per_block:
            # second under tf32, after the fastest box of the probe; third under bf16, where no
            # two-row box has been timed and the second box seed won on #1's shape (docs/benchmarks.md,
            # "The box path's input copy in the dots' dtype")
            seeds.insert(min(1 if precision == "tf32" else 2, len(seeds)), c)
    return seeds


def box_space(out: tuple[int, int, int], precision: str, n: int, k: int, spec: DeviceSpec, elem_bytes: int,
              window: tuple[int, int, int] = (1, 1, 1)) -> list[dict]:
    """Every box config of the template's tensor-descriptor path for an output of (D, H, W) pixels
    per image, N = `n` output channels and K = `k` (input channels x taps): the product of tiles
    (BLOCK_M 64-256 pixels, BLOCK_N up to N's power of two, K steps of 32 to 256 bytes), warps,
    stages and every box of BLOCK_M pixels holding whole `window`s with rows of at least 16 pixels,
    the two-row reads (TWO_ROWS) where a box has two rows, that fit the device's shared memory.
    The seeds (`box_configs`) are a few of these; this is the space a probe samples."""
    cap_n, cap_k = max(16, next_pow2(n)), block_k_cap(k, None)
    configs = []
    for bm, bn, bk, w, s in itertools.product((64, 128, 256), (64, 128, 256), (16, 32, 64, 128), (4, 8), (2, 3, 4, 5)):
        if bn > cap_n or bk > cap_k or not 32 <= bk * elem_bytes <= 256 or not 8 <= bm * bn / (32 * w) <= 128:
            continue
        for box in _box_shapes(bm, window):
            if box[2] < 16 or any(x > max(next_pow2(o), q) for x, o, q in zip(box, out, window)):
                continue
            c = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=AXES["GROUP_M"][0], num_warps=w, num_stages=s,
                     BOX_D=box[0], BOX_H=box[1], BOX_W=box[2])
            if smem_bytes(c, elem_bytes) > spec.smem_per_block:
                continue
            configs.append(c)
            if box[0] * box[1] == 2:
                configs.append(dict(c, TWO_ROWS=1))
    return configs


__all__ = ["box_space", "CONFIG_KEYS", "BOX_KEYS", "BOXES_FIRST_PIXELS", "FLAT_KEYS", "FLAT_SEEDS", "flat_configs", "ROW_KEYS", "SPLIT_KEYS", "WARP_KEYS", "TWO_ROW_SEEDS", "split_k", "AXES", "SEEDS", "BOX_SEEDS", "conv_space", "box_configs", "best_box",
           "block_k_cap", "smem_bytes", "programs"]
