"""The convolution template's schedule space (space/conv_space.py): shared-memory budget, BLOCK_K
cap, seed order, SM fill."""
import dataclasses
import math

import pytest

from kernelwright.analyze.device import H200
from kernelwright.space.conv_space import (BOX_KEYS, BOXES_FIRST_PIXELS, CONFIG_KEYS, ROW_KEYS, SEEDS, best_box, block_k_cap, conv_space, programs,
                                           smem_bytes, split_k)

RESNET = dict(M=32 * 56 * 56, N=256, K=256 * 9, channels=256)  # ResNet 3x3 256 -> 256, 56 x 56, batch 32


def _fake(smem_kib, sms=132):
    return dataclasses.replace(H200, name="fake", smem_per_block=smem_kib * 1024, sms=sms)


@pytest.mark.parametrize("precision,eb", [("fp32", 4), ("tf32", 4), ("bf16", 2), ("bf16", 4)])
@pytest.mark.parametrize("smem_kib", [48, 100, 227])
def test_smem_budget(precision, eb, smem_kib):
    spec = _fake(smem_kib)
    space = conv_space(**RESNET, precision=precision, elem_bytes=eb, spec=spec, max_configs=200)
    assert space
    assert all(smem_bytes(c, eb) <= spec.smem_per_block for c in space)
    assert all(set(c) == set(CONFIG_KEYS) for c in space)
    assert len({tuple(sorted(c.items())) for c in space}) == len(space)  # no repeats


def test_smaller_budget_drops_big_tiles():
    big = conv_space(**RESNET, precision="tf32", elem_bytes=4, spec=_fake(227), max_configs=1000)
    small = conv_space(**RESNET, precision="tf32", elem_bytes=4, spec=_fake(64), max_configs=1000)
    assert len(small) < len(big)
    assert max(smem_bytes(c, 4) for c in big) > 64 * 1024


@pytest.mark.parametrize("channels,cap", [(1, 16), (3, 32), (8, 64), (16, 16), (24, 32), (64, 64), (256, 128)])
def test_block_k_cap(channels, cap):
    assert block_k_cap(channels * 9, channels) == cap
    space = conv_space(M=4096, N=64, K=channels * 9, channels=channels, precision="bf16", elem_bytes=2,
                       spec=H200, max_configs=200)
    assert max(c["BLOCK_K"] for c in space) <= cap
    assert min(c["BLOCK_K"] for c in space) >= 16
    # without the channel count, K alone caps it
    assert all(c["BLOCK_K"] <= block_k_cap(20, None) for c in
               conv_space(M=4096, N=64, K=20, precision="tf32", elem_bytes=4, spec=H200))


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_seed_order_tensor_core_tiles_first(precision):
    space = conv_space(**RESNET, precision=precision, elem_bytes=4 if precision == "tf32" else 2, spec=H200)
    first = space[0]
    bm, bn, bk, w, s = SEEDS[precision][0]
    assert (first["BLOCK_M"], first["BLOCK_N"], first["BLOCK_K"], first["num_warps"], first["num_stages"]) \
        == (bm, bn, bk, w, s)
    assert all(c["BLOCK_M"] * c["BLOCK_N"] >= 64 * 128 for c in space[:4])


def test_small_n_gets_narrow_tiles():
    space = conv_space(M=32 * 56 * 56, N=24, K=16 * 9, channels=16, precision="tf32", elem_bytes=4, spec=H200)
    assert all(c["BLOCK_N"] <= 32 for c in space)
    assert space[0]["BLOCK_N"] == 32 and space[0]["BLOCK_M"] >= 128  # the seed's pixel tile kept
    assert all(c["BLOCK_K"] == 16 for c in space)


def test_enough_programs_for_the_sms():
    spec = _fake(227, sms=132)
    M, N = 16 * 16 * 2, 64  # 512 pixels: 128 x 64 tiles make 4 programs
    space = conv_space(M=M, N=N, K=64 * 9, channels=64, precision="tf32", elem_bytes=4, spec=spec)
    best = max(programs(c, M, N) for c in space)
    assert all(programs(c, M, N) >= best for c in space[:4])
    # the groups run side by side: with 64 of them, big tiles fill the SMs again
    grouped = conv_space(M=M, N=N, K=64 * 9, channels=64, precision="tf32", elem_bytes=4, spec=spec, groups=64)
    assert all(programs(c, M, N, 64) >= spec.sms for c in grouped)
    assert grouped[0]["BLOCK_M"] == 128


def test_fp32_shallow_pipelines_and_unknown_precision():
    assert all(c["num_stages"] <= 3 for c in conv_space(**RESNET, precision="ieee", elem_bytes=4, spec=H200))
    with pytest.raises(ValueError, match="precision"):
        conv_space(**RESNET, precision="fp8", elem_bytes=1, spec=H200)


def test_tiny_problem_still_has_a_config():
    space = conv_space(M=1, N=1, K=1, precision="bf16", elem_bytes=2, spec=_fake(16, sms=1))
    assert space and all(c["BLOCK_M"] >= 16 and c["BLOCK_N"] >= 16 and c["BLOCK_K"] >= 16 for c in space)


def test_pooling_window_sets_the_smallest_pixel_tile():
    space = conv_space(M=64 * 30 * 62 * 62, N=16, K=81, channels=3, precision="tf32", elem_bytes=4, spec=H200,
                       min_block_m=128, max_configs=200)
    assert space and all(c["BLOCK_M"] >= 128 for c in space)
    tiny = conv_space(M=40, N=16, K=27, channels=3, precision="tf32", elem_bytes=4, spec=H200, min_block_m=64)
    assert tiny and all(c["BLOCK_M"] >= 64 for c in tiny)


def test_whole_n_tiles_span_every_channel():
    space = conv_space(M=32 * 56 * 56, N=24, K=16 * 9, channels=16, precision="tf32", elem_bytes=4, spec=H200,
                       whole_n=True, max_configs=200)
    assert space and all(c["BLOCK_N"] == 32 for c in space)
    assert conv_space(M=4096, N=300, K=64, precision="tf32", elem_bytes=4, spec=H200, whole_n=True) == []


@pytest.mark.parametrize("out,pixels,box", [
    ((1, 224, 224), 128, (1, 4, 32)),  # 224 = 7 x 32: no padded pixel
    ((1, 56, 56), 128, (1, 2, 64)),  # every box of 128 pads 56 to 64 once; the widest wins
    ((1, 56, 56), 64, (1, 1, 64)),  # not (1, 8, 8), which pads as little: rows of at least 16 pixels
    ((1, 14, 14), 128, (1, 8, 16)),
    ((32, 64, 64), 128, (1, 2, 64)),
    ((1, 1, 100), 128, (1, 1, 128)),  # a 1-D output
    ((1, 1, 8), 64, (1, 1, 64)),  # nothing fits: one row
])
def test_best_box_pads_least(out, pixels, box):
    assert best_box(out, pixels) == box
    assert best_box(out, pixels)[0] * best_box(out, pixels)[1] * best_box(out, pixels)[2] == pixels


@pytest.mark.parametrize("out,pixels,window,box", [
    ((1, 56, 56), 128, (1, 2, 2), (1, 2, 64)),  # the window-free best already holds 2 x 2 windows
    ((1, 56, 56), 64, (1, 2, 2), (1, 2, 32)),  # a one-row box would cut every window
    ((1, 1, 100), 128, (1, 1, 4), (1, 1, 128)),
    ((16, 32, 32), 128, (2, 2, 2), (2, 2, 32)),
    ((2, 8, 8), 128, (2, 2, 2), (2, 4, 16)),  # wider than the output rather than a row of 8
    ((1, 62, 62), 64, (1, 4, 4), (1, 4, 16)),
])
def test_best_box_holds_whole_pool_windows(out, pixels, window, box):
    assert best_box(out, pixels, window) == box
    assert best_box((1, 56, 56), 16, (1, 1, 32)) is None  # no box of 16 pixels holds a 32-wide window


def test_split_k_next_to_the_first_configs_where_tiles_leave_the_sms_idle():
    """A late ResNet layer at batch 2 (98 pixels, 512 channels, K = 4608) makes a few tiles: each of
    the first configs is followed by its split-K variant (programs within one wave, >= 4 K steps
    each); a large output gets none."""
    small = dict(M=98, N=512, K=4608, channels=512, precision="tf32", elem_bytes=4, spec=H200)
    space = conv_space(**small)
    splits = [c for c in space[:8] if c.get("SPLIT_K", 1) > 1]
    assert splits and space[1] == dict(space[0], SPLIT_K=space[1]["SPLIT_K"])
    for c in splits:
        assert programs(c, 98, 512) * c["SPLIT_K"] <= H200.sms and 4608 / c["BLOCK_K"] / c["SPLIT_K"] >= 4
        assert c["SPLIT_K"] == split_k(c, 98, 512, 4608, 1, H200) and c["SPLIT_K"] & (c["SPLIT_K"] - 1) == 0
    assert not any("SPLIT_K" in c for c in conv_space(**RESNET, precision="tf32", elem_bytes=4, spec=H200))
    assert split_k(dict(space[0]), 98, 512, 64, 1, H200) == 1  # too few K steps to share


def test_pool_fused_box_configs_hold_whole_windows():
    space = conv_space(**RESNET, precision="tf32", elem_bytes=4, spec=H200, box_out=(1, 56, 56), box_window=(1, 4, 4),
                       min_block_m=32, max_configs=200)
    boxes = [c for c in space if "BOX_W" in c]
    assert boxes and all(c["BOX_H"] % 4 == 0 and c["BOX_W"] % 4 == 0 for c in boxes)


@pytest.mark.parametrize("precision,eb", [("tf32", 4), ("bf16", 2), ("bf16", 4)])
def test_box_configs_alternate_with_the_others_where_the_descriptor_path_applies(precision, eb):
    plain = conv_space(**RESNET, precision=precision, elem_bytes=eb, spec=H200)
    boxed = conv_space(**RESNET, precision=precision, elem_bytes=eb, spec=H200, box_out=(1, 56, 56))
    boxes = [c for c in boxed if "BOX_W" in c]
    assert boxes and ["BOX_W" in c for c in boxed[:2 * len(boxes)]] == [True, False] * len(boxes)  # alternating
    assert all(not any(k in c for k in BOX_KEYS) for c in plain)
    for c in boxes:
        assert set(c) == set(CONFIG_KEYS + BOX_KEYS)
        assert c["BOX_D"] * c["BOX_H"] * c["BOX_W"] == c["BLOCK_M"]
        assert smem_bytes(c, eb) <= H200.smem_per_block
        if precision == "bf16" and c["BOX_D"] * c["BOX_H"] > 1:
            assert c["num_warps"] == 4  # (multi-row bf16 boxes miscompiled at 8 warps)
    assert [c for c in boxed if "BOX_W" not in c] == [c for c in plain if c in boxed]
    assert conv_space(**RESNET, precision="fp32", elem_bytes=4, spec=H200, box_out=(1, 56, 56)) == \
        conv_space(**RESNET, precision="fp32", elem_bytes=4, spec=H200)  # FMA path: no boxes


@pytest.mark.parametrize("precision,eb", [("tf32", 4), ("bf16", 2)])
def test_two_row_boxes_come_second_where_rows_are_wide(precision, eb):
    """KernelBench level-2 #1's 126 x 126 output: a 256-pixel box is two 128-pixel rows, the second
    box config under tf32 (after the probe's fastest box), the third under bf16 (untimed there), at
    8 warps (no two-row box's reshape: the bf16 4-warp rule does not apply) and within shared
    memory; 56 x 56 rows take no such config. So large an output (BOXES_FIRST_PIXELS) takes two
    boxes before the first gather config; a smaller one alternates from the first."""
    wide = dict(M=128 * 126 * 126, N=128, K=64 * 9, channels=64)
    space = conv_space(**wide, precision=precision, elem_bytes=eb, spec=H200, box_out=(1, 126, 126))
    two = [c for c in space if c.get("TWO_ROWS")]
    boxes = [c for c in space if "BOX_W" in c]
    assert len(two) == 1 and boxes.index(two[0]) == (1 if precision == "tf32" else 2)
    assert wide["M"] >= BOXES_FIRST_PIXELS
    assert ["BOX_W" in c for c in space[:3]] == [True, True, False] and space[:2] == boxes[:2]
    small = conv_space(**dict(wide, M=BOXES_FIRST_PIXELS - 1), precision=precision, elem_bytes=eb, spec=H200,
                       box_out=(1, 126, 126))
    assert ["BOX_W" in c for c in small[:4]] == [True, False, True, False] and small[2] == boxes[1]
    c = two[0]
    assert (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]) == (256, 128, 8)
    assert (c["BOX_D"], c["BOX_H"], c["BOX_W"]) == (1, 2, 128) and set(c) == set(CONFIG_KEYS + BOX_KEYS + ROW_KEYS)
    assert smem_bytes(c, eb) <= H200.smem_per_block
    narrow = conv_space(**RESNET, precision=precision, elem_bytes=eb, spec=H200, box_out=(1, 56, 56))
    assert not any(c.get("TWO_ROWS") for c in narrow)


def test_box_configs_are_sized_for_the_operands_they_load():
    """Under bf16 a float32 NCHW input reaches the box configs as a bf16 copy: with box_elem_bytes=2
    their shared memory is counted in 2-byte operands, which keeps the two-row 256 x 128 x 64 box
    (3 stages: 288 KiB in float32, 144 KiB in bf16) the float32 count leaves out; the other configs
    keep elem_bytes' count."""
    wide = dict(M=128 * 126 * 126, N=128, K=64 * 9, channels=64, precision="bf16", spec=H200, box_out=(1, 126, 126))
    as_f32 = conv_space(**wide, elem_bytes=4)
    as_bf16 = conv_space(**wide, elem_bytes=4, box_elem_bytes=2)
    assert not any(c.get("TWO_ROWS") for c in as_f32)
    (two,) = [c for c in as_bf16 if c.get("TWO_ROWS")]
    assert smem_bytes(two, 4) > H200.smem_per_block >= smem_bytes(two, 2)
    gathers = [c for c in as_bf16 if "BOX_W" not in c]  # (one fewer within max_configs)
    assert gathers == [c for c in as_f32 if "BOX_W" not in c][:len(gathers)]


def test_box_configs_respect_whole_n_and_the_channel_cap():
    space = conv_space(M=4096, N=48, K=32 * 9, channels=32, precision="bf16", elem_bytes=2, spec=H200,
                       whole_n=True, box_out=(1, 64, 64))
    boxes = [c for c in space if "BOX_W" in c]
    assert boxes and all(c["BLOCK_N"] == 64 and c["BLOCK_K"] <= 32 for c in boxes)


@pytest.mark.parametrize("box", [None, (1, 126, 126)])
def test_the_first_configs_differ_in_tile_where_the_seeds_shrink_to_one(box):
    """A narrow convolution (N = 32 or 64) shrinks several seeds to one tile: the first three configs
    (box and gather alike) still have three different tiles, so a small budget compares tile shapes."""
    for n in (32, 64):
        space = conv_space(M=64 * 126 * 126, N=n, K=8 * 9 if n == 32 else 64 * 9, channels=8 if n == 32 else 64,
                           precision="tf32", elem_bytes=4, spec=H200, box_out=box)
        tiles = [(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.get("BOX_W")) for c in space[:3]]
        assert len(set(tiles)) == 3, tiles


def test_padded_grid_configs_enter_after_the_first_measured_ones():
    """flat=True adds the FLAT configs (BLOCK_N and BLOCK_K shrunk to the problem's caps) after the
    space's first FLAT_AFTER configs, one before each of the next; bf16 ones are sized for the
    2-byte padded copy even where the tensor is float32; flat=False adds none."""
    from kernelwright.space.conv_space import FLAT_AFTER, flat_configs

    kw = dict(M=128 * 126 * 126, N=64, K=64 * 9, elem_bytes=4, spec=H200, channels=64, box_out=(1, 126, 126))
    for prec in ("tf32", "bf16"):
        plain = conv_space(precision=prec, **kw)
        cs = conv_space(precision=prec, flat=True, **kw)
        assert not any(c.get("FLAT") for c in plain)
        assert cs[:FLAT_AFTER] == plain[:FLAT_AFTER]
        flats = [i for i, c in enumerate(cs) if c.get("FLAT")]
        assert flats and flats[0] == FLAT_AFTER and flats == list(range(FLAT_AFTER, FLAT_AFTER + 2 * len(flats), 2))
        assert all(cs[i]["BLOCK_N"] <= 64 and cs[i]["BLOCK_K"] <= 64 for i in flats)
        assert [cs[i] for i in flats] == [c for c in flat_configs(prec, 64, 64, False)
                                          if smem_bytes(c, 2 if prec == "bf16" else 4) <= H200.smem_per_block]
    big = conv_space(precision="bf16", flat=True, **dict(kw, N=128))
    assert dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4, FLAT=True) in big


@pytest.mark.parametrize("precision,eb", [("tf32", 4), ("bf16", 2)])
def test_the_box_space_holds_the_seeds_and_only_configs_the_template_takes(precision, eb):
    """box_space, the box path's whole product a probe samples: every config's box holds BLOCK_M
    pixels in rows of at least 16, within the output's padded sides and whole pool windows; it fits
    shared memory; two-row reads only of two-row boxes; and the seeds (box_configs, cap as in
    conv_space) are among them."""
    from kernelwright.space.conv_space import box_configs, box_space
    out = (1, 126, 126)
    space = box_space(out, precision, 128, 64 * 9, H200, eb)
    assert len(space) > 100 and len({tuple(sorted(c.items())) for c in space}) == len(space)
    for c in space:
        assert c["BOX_D"] * c["BOX_H"] * c["BOX_W"] == c["BLOCK_M"] and c["BOX_W"] >= 16 and c["BOX_H"] <= 128
        assert smem_bytes(c, eb) <= H200.smem_per_block and c["BLOCK_N"] <= 128 and 32 <= c["BLOCK_K"] * eb <= 256
        assert not c.get("TWO_ROWS") or c["BOX_D"] * c["BOX_H"] == 2
    seeds = box_configs(out, precision, 128, 64, False, H200, eb)
    assert seeds and all(s in space for s in seeds)
    pooled = box_space((1, 56, 56), precision, 64, 64 * 9, H200, eb, window=(1, 4, 4))
    assert pooled and all(c["BOX_H"] % 4 == 0 and c["BOX_W"] % 4 == 0 for c in pooled)


def test_bf16_starts_from_a_two_row_box_where_it_pads_no_more():
    """Under bf16 the first box config is 128 x 128 x 64 at 4 warps on a 2 x 64 box where two rows pad
    the output no more than best_box's one 128-pixel row (126 x 126), the rest of the seeds after it;
    where two rows pad more (14 x 14 rows, a 3-D output of 32-pixel rows) the seeds start as before,
    and tf32 keeps its order."""
    wide = dict(M=128 * 126 * 126, N=128, K=64 * 9, channels=64, spec=H200, box_out=(1, 126, 126))
    first = conv_space(**wide, precision="bf16", elem_bytes=4, box_elem_bytes=2)[0]
    assert first == dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3,
                         BOX_D=1, BOX_H=2, BOX_W=64)
    tf32 = conv_space(**wide, precision="tf32", elem_bytes=4)[0]
    assert (tf32["BOX_H"], tf32["BOX_W"], tf32["num_warps"]) == (1, 128, 8)
    for out in ((1, 14, 14), (16, 32, 32)):
        m = 32 * math.prod(out)
        boxes = [c for c in conv_space(M=m, N=128, K=64 * 9, channels=64, spec=H200, box_out=out, precision="bf16",
                                       elem_bytes=2) if "BOX_W" in c]
        assert boxes and boxes[0]["BOX_H"] * boxes[0]["BOX_D"] != 2
