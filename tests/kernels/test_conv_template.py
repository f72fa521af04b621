"""The implicit-GEMM convolution template (codegen/triton_conv.py, templates/triton/conv.py.j2)
against torch.ops.aten.convolution: 1-3 spatial dims, dense, grouped, depthwise and transposed,
NCHW and channels-last, fused epilogues, bf16, and the first configs of its space. Triton's
interpreter runs the kernels on the CPU; outputs are NaN-poisoned, so an element the kernel does
not store fails."""
import math
import os

import pytest
import torch

from kernelwright.analyze.device import H200
from kernelwright.build.pyload import load_module_from_source
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.codegen.triton_conv import render_conv
from kernelwright.space.conv_space import conv_space

DEVICE = os.environ.get("KW_TRITON_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.interpreter if DEVICE == "cpu" else pytest.mark.gpu
if DEVICE == "cuda":  # references in IEEE float32
    torch.backends.cudnn.allow_tf32 = False
TILE = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)
TOL = 1e-4


@pytest.fixture(scope="module")
def mods(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kwconv")
    out = {}

    def get(transposed=False, epilogue=None, name="kw_conv", prologue=None, in_pool=None):
        key = (transposed, epilogue, name, prologue, in_pool)
        if key not in out:
            text = render_conv(epilogue or Epilogue(), name=name, transposed=transposed, prologue=prologue or Epilogue(),
                               in_pool=in_pool)
            mod = load_module_from_source(text, f"{name}_{int(transposed)}", cache)
            # NaN-poisoned outputs: an element the kernel leaves unwritten fails the comparison
            mod._alloc = lambda shape, dtype, device, stride=None: torch.full(shape, float("nan"), dtype=dtype,
                                                                           device=device).as_strided(
                shape, stride or torch.empty(shape, device="meta").stride())
            out[key] = mod
        return out[key]
    return get


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(*shape, g):
    return torch.randn(*shape, generator=g).to(DEVICE)


def _channels_last(t):
    """t ([N, C, *spatial]) in channels-last memory, same values."""
    nd = t.dim() - 2
    return t.permute(0, *range(2, nd + 2), 1).contiguous().permute(0, nd + 1, *range(1, nd + 1))


def _close(out, ref, tol=TOL):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = (out.double() - ref.double()).abs().max().item()
    assert torch.allclose(out.double(), ref.double(), atol=tol, rtol=tol), err


def _ref(x, w, transposed, stride=1, padding=0, dilation=1, groups=1, output_padding=0):
    nd = x.dim() - 2
    per = lambda v: [v] * nd if isinstance(v, int) else list(v)  # noqa: E731
    return torch.ops.aten.convolution(x, w, None, per(stride), per(padding), per(dilation), transposed,
                                      per(output_padding), groups)


def _case(transposed, batch, cin, cout, size, kernel, groups, seed):
    g = _gen(seed)
    x = _rand(batch, cin, *size, g=g)
    wshape = (cin, cout // groups, *kernel) if transposed else (cout, cin // groups, *kernel)
    return x, _rand(*wshape, g=g)


# (batch, Cin, Cout, spatial, kernel, conv args)
FORWARD = {
    "1d-s2-d2": (2, 4, 6, (11,), (3,), dict(stride=2, padding=1, dilation=2)),
    "2d-asym": (2, 3, 5, (7, 6), (3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
    "2d-wide-cin": (1, 32, 17, (5, 5), (3, 3), dict(padding=1)),  # one tap per step: 32 channels = 2 K blocks
    "3d": (1, 3, 4, (4, 5, 3), (2, 3, 1), dict(stride=(1, 2, 1), padding=(1, 1, 0), dilation=(2, 1, 1))),
    "groups2": (2, 6, 4, (6, 5), (3, 3), dict(padding=1, groups=2)),
    "depthwise": (2, 5, 5, (6, 7), (3, 3), dict(stride=2, padding=1, groups=5)),
    "multiplier": (1, 3, 6, (5, 5), (3, 1), dict(padding=(1, 0), groups=3)),  # 2 output channels per input
    "3d-depthwise": (1, 4, 8, (3, 4, 4), (3, 3, 3), dict(padding=1, groups=4)),
    # folded taps tested by one bit per tap: 49 taps in 64-bit masks, 81 past them (bounds per element)
    "2d-7x7-stem": (1, 3, 5, (9, 8), (7, 7), dict(stride=2, padding=3)),
    "2d-9x9": (1, 2, 4, (7, 10), (9, 9), dict(padding=(4, 1), stride=(1, 2))),
}


@pytest.mark.parametrize("layout", ["nchw", "cl"])
@pytest.mark.parametrize("case", list(FORWARD), ids=str)
def test_conv_forward(mods, case, layout):
    batch, cin, cout, size, kernel, args = FORWARD[case]
    x, w = _case(False, batch, cin, cout, size, kernel, args.get("groups", 1), seed=len(case))
    ref = _ref(x, w, False, **args)
    if layout == "cl":
        x, w = _channels_last(x), _channels_last(w)
    _close(mods(False).launch(x, w, **args, **TILE), ref)


TRANSPOSED = {
    "1d-s3-k2": (2, 3, 4, (5,), (2,), dict(stride=3, padding=0)),  # kernel < stride: a class without taps
    "1d-s2-k5-op1": (1, 4, 3, (6,), (5,), dict(stride=2, padding=2, output_padding=1)),  # kernel not divisible
    "2d-s2-k3": (2, 4, 5, (4, 5), (3, 3), dict(stride=2, padding=1, output_padding=1)),
    "2d-s1": (1, 3, 4, (5, 4), (3, 2), dict(stride=1, padding=(1, 0), dilation=(2, 1))),
    "2d-s23-dil": (1, 3, 4, (4, 3), (4, 5), dict(stride=(2, 3), padding=(1, 2), dilation=(1, 2),
                                                   output_padding=(1, 1))),
    "2d-s2-d2": (1, 2, 3, (4, 4), (3, 2), dict(stride=2, dilation=2, padding=1, output_padding=1)),  # gcd 2
    "2d-s3-d2-op": (1, 3, 2, (4, 3), (3, 4), dict(stride=3, dilation=2, padding=(2, 1), output_padding=(1, 2))),
    "3d-s2": (1, 3, 4, (3, 3, 2), (3, 2, 3), dict(stride=(2, 2, 1), padding=(1, 0, 1), output_padding=(1, 1, 0))),
    "groups2": (2, 4, 6, (4, 4), (3, 3), dict(stride=2, padding=1, groups=2)),
    "depthwise": (1, 4, 4, (3, 4), (4, 4), dict(stride=2, padding=1, groups=4)),
    "wide-cin": (1, 32, 5, (3, 4), (2, 3), dict(stride=(2, 1), padding=(0, 1))),
}


@pytest.mark.parametrize("layout", ["nchw", "cl"])
@pytest.mark.parametrize("case", list(TRANSPOSED), ids=str)
def test_conv_transposed(mods, case, layout):
    batch, cin, cout, size, kernel, args = TRANSPOSED[case]
    x, w = _case(True, batch, cin, cout, size, kernel, args.get("groups", 1), seed=len(case))
    ref = _ref(x, w, True, **args)
    if layout == "cl":
        x, w = _channels_last(x), _channels_last(w)
    _close(mods(True).launch(x, w, **args, **TILE), ref)


# (batch, Cin, Cout, spatial, kernel, conv args, box): stride-1, one-group convolutions a box config
# reads through tensor descriptors when x is channels-last
BOXES = {
    "1d-pad": (2, 16, 16, (13,), (5,), dict(padding=2), (1, 1, 16)),
    "2d-ragged": (2, 16, 20, (9, 11), (3, 3), dict(padding=1), (1, 2, 8)),  # boxes past the output's edge
    "2d-dil-cin20": (1, 20, 24, (7, 8), (3, 3), dict(padding=2, dilation=2), (1, 4, 4)),  # K block past Cin
    "2d-asym-k": (2, 32, 16, (6, 9), (3, 5), dict(padding=(1, 2)), (1, 2, 8)),  # two channel blocks per tap
    "3d": (1, 16, 16, (5, 6, 7), (3, 3, 3), dict(padding=1), (2, 2, 4)),
    "1x1": (2, 16, 24, (5, 6), (1, 1), dict(), (1, 2, 8)),
}


def _box_case(mod, transposed, name, spec):
    """(x, w, conv args, box tile, reference) of a box case, after checking that a channels-last x
    takes the descriptor path and gives the reference, into NCHW and channels-last outputs."""
    batch, cin, cout, size, kernel, args, box = spec
    x, w = _case(transposed, batch, cin, cout, size, kernel, 1, seed=len(name))
    ref = _ref(x, w, transposed, **args)
    tile = dict(TILE, BLOCK_M=math.prod(box), BOX_D=box[0], BOX_H=box[1], BOX_W=box[2])
    xcl = _channels_last(x) if x.dim() > 3 else x.transpose(1, 2).contiguous().transpose(1, 2)
    assert mod.tma_box_ok(xcl, 1, (1,) * (x.dim() - 2)) == "channels-last"
    _close(mod.launch(xcl, w, **args, **tile), ref)
    _close(mod.launch(xcl, _channels_last(w), **args, **tile, out_channels_last=True), ref)
    return x, w, args, tile, ref


@pytest.mark.parametrize("case", list(BOXES), ids=str)
def test_box_tiles_read_through_descriptors(mods, case):
    """Box configs: the tile is a box of output pixels and each tap's input box comes through a tensor
    descriptor whose zero fill is the padding (negative and past-the-end coordinates), for
    channels-last x and for NCHW x (copied channels-last first); x in neither layout takes the
    gather path with the same tile, and gives the same result."""
    mod = mods(False)
    x, w, args, tile, ref = _box_case(mod, False, case, BOXES[case])
    assert mod.tma_box_ok(x, 1, (1,) * (x.dim() - 2)) == "copy"  # NCHW: copied channels-last first
    _close(mod.launch(x, w, **args, **tile), ref)
    strided = x[..., ::2]  # neither layout: gathered through its strides
    assert mod.tma_box_ok(strided, 1, (1,) * (x.dim() - 2)) is None
    _close(mod.launch(strided, w, **args, **tile), _ref(strided, w, False, **args))


# transposed convolutions of one group read through descriptors, box per phase class:
# (batch, Cin, Cout, spatial, kernel, conv args, box)
TRANSPOSED_BOXES = {
    "2d-s2-k3-op1": (2, 16, 16, (5, 6), (3, 3), dict(stride=2, padding=1, output_padding=1), (1, 2, 8)),
    "2d-s2-k4": (1, 16, 20, (4, 7), (4, 4), dict(stride=2, padding=1), (1, 4, 4)),
    "2d-s3-d2": (1, 32, 16, (4, 5), (3, 2), dict(stride=(3, 2), dilation=(2, 1), padding=(2, 0),
                                                 output_padding=(1, 0)), (1, 2, 8)),
    # phase classes without taps: a kernel shorter than the stride (h), a dilation the stride divides (w)
    "2d-tapless": (1, 16, 16, (4, 5), (2, 2), dict(stride=(3, 2), dilation=(1, 2), output_padding=(1, 1)), (1, 2, 8)),
    "2d-s1": (2, 16, 16, (6, 5), (3, 3), dict(padding=1), (1, 2, 8)),
    "3d-s2": (1, 16, 16, (3, 4, 3), (3, 3, 3), dict(stride=2, padding=1, output_padding=1), (2, 2, 4)),
    "1d-s2": (2, 16, 16, (9,), (4,), dict(stride=2, padding=1), (1, 1, 16)),
}


@pytest.mark.parametrize("case", list(TRANSPOSED_BOXES), ids=str)
def test_transposed_box_tiles_per_phase_class(mods, case):
    """A transposed convolution's box config: each phase class is a stride-1 walk of its input, so a
    box of the class's output sub-grid reads each of its taps' inputs as one descriptor box (the
    zero fill covers the edges); channels-last and NCHW x (copied first), and a class with no taps
    (stride past the kernel) storing zeros."""
    mod = mods(True)
    x, w, args, tile, ref = _box_case(mod, True, case, TRANSPOSED_BOXES[case])
    _close(mod.launch(x, w, **args, **tile), ref)


def test_box_tiles_with_an_epilogue_and_bf16(mods, monkeypatch):
    """The box path feeds the same epilogue (col, full and scalar operands over the output's
    coordinates) and rounds float32 tiles to bf16 with CAST_BF16; an NCHW float32 input is copied
    channels-last once, in bf16 (the dot's dtype), by the tiled copy kernel."""
    mod = mods(False, EPI, name="kw_conv_box_epi")
    x, w = _case(False, 2, 16, 16, (6, 7), (3, 3), 1, seed=7)
    g = _gen(8)
    e0, e1, e2 = _rand(16, g=g), _rand(2, 16, 6, 7, g=g), torch.tensor(0.5)
    ref = torch.relu((_ref(x, w, False, padding=1) + e0[:, None, None]) * e2 + e1)
    tile = dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8)
    _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, **tile), ref)
    xb, wb = _bf16(x), _bf16(w)
    refb = torch.relu((_ref(xb, wb, False, padding=1) + e0[:, None, None].double()) * e2.double() + e1.double())
    _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, CAST_BF16=True, **tile), refb, tol=1e-3)
    copies, copy = [], mod._padded_channels_last
    monkeypatch.setattr(mod, "_padded_channels_last", lambda t, pad, dtype: copies.append((pad, dtype)) or copy(t, pad, dtype))
    _close(mod.launch(x, w, e0, e1, e2, padding=1, CAST_BF16=True, **tile), refb, tol=1e-3)
    assert copies == [((0, 0), torch.bfloat16)]


# boxes of two rows: (batch, Cin, Cout, spatial, kernel, conv args, box, transposed)
TWO_ROW_BOXES = {
    "2d-ragged": (2, 16, 20, (9, 11), (3, 3), dict(padding=1), (1, 2, 16), False),
    "2d-two-channel-blocks": (2, 32, 16, (5, 17), (3, 5), dict(padding=(1, 2)), (1, 2, 16), False),
    "3d-rows-along-d": (1, 16, 16, (5, 4, 7), (3, 3, 3), dict(padding=1), (2, 1, 16), False),
    "2d-transposed-s2": (2, 16, 16, (5, 6), (3, 3), dict(stride=2, padding=1, output_padding=1), (1, 2, 16), True),
}


@pytest.mark.parametrize("case", list(TWO_ROW_BOXES), ids=str)
def test_two_row_boxes_read_each_row_into_its_own_accumulator(mods, case):
    """TWO_ROWS: a box of two rows (along h, or along d) read as two one-row descriptor boxes into
    two accumulators sharing each weight tile, joined back into the box's pixel order for the
    stores; channels-last and NCHW x, an NCHW and a channels-last output, and a transposed
    convolution's phase classes."""
    *spec, transposed = TWO_ROW_BOXES[case]
    mod = mods(transposed)
    x, w, args, tile, ref = _box_case(mod, transposed, case, spec)
    two = dict(tile, TWO_ROWS=1)
    xcl = _channels_last(x)
    _close(mod.launch(xcl, w, **args, **two), ref)
    _close(mod.launch(x, w, **args, **two, out_channels_last=True), ref)


def test_two_row_boxes_with_an_epilogue_and_bf16(mods):
    mod = mods(False, EPI, name="kw_conv_box_epi")
    x, w = _case(False, 2, 16, 16, (6, 7), (3, 3), 1, seed=7)
    g = _gen(8)
    e0, e1, e2 = _rand(16, g=g), _rand(2, 16, 6, 7, g=g), torch.tensor(0.5)
    tile = dict(TILE, BLOCK_M=32, BOX_D=1, BOX_H=2, BOX_W=16, TWO_ROWS=1)
    xb, wb = _bf16(x), _bf16(w)
    refb = torch.relu((_ref(xb, wb, False, padding=1) + e0[:, None, None].double()) * e2.double() + e1.double())
    _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, CAST_BF16=True, **tile), refb, tol=1e-3)


# padded-grid tiles (FLAT): (batch, Cin, Cout, spatial, kernel, conv args)
FLATS = {
    "2d-pad1": (2, 16, 20, (5, 7), (3, 3), dict(padding=1)),
    "2d-no-pad-two-channel-blocks": (2, 32, 16, (6, 9), (3, 3), dict()),
    "2d-asym-dilated": (1, 16, 16, (7, 8), (3, 2), dict(padding=(2, 0), dilation=(2, 3))),
    "3d": (1, 16, 8, (4, 5, 6), (3, 3, 3), dict(padding=1)),
    "1d": (2, 16, 16, (13,), (5,), dict(padding=2)),
    "1x1-channels-past-the-block": (2, 24, 16, (3, 5), (1, 1), dict()),
}


@pytest.mark.parametrize("case", list(FLATS), ids=str)
def test_padded_grid_tiles_read_each_tap_as_one_2d_box(mods, case):
    """FLAT: a tile is BLOCK_M consecutive pixels of the zero-padded input's grid and every tap a
    constant shift of its rows, read through one 2-D descriptor; padding, dilation, 1-3 spatial
    dims, input channels past one K block (the descriptor's zero fill), NCHW and channels-last x,
    NCHW and channels-last outputs (NaN-poisoned: the grid's rows past the output store nothing)."""
    mod = mods(False)
    batch, cin, cout, size, kernel, args = FLATS[case]
    x, w = _case(False, batch, cin, cout, size, kernel, 1, seed=len(case))
    ref = _ref(x, w, False, **args)
    tile = dict(TILE, FLAT=1)
    assert mod.flat_ok(x, 1, (1,) * len(size))
    _close(mod.launch(x, w, **args, **tile), ref)
    _close(mod.launch(_channels_last(x) if x.dim() > 3 else x, w, **args, **tile, out_channels_last=True), ref)
    _close(mod.launch(x, w, **args, **dict(tile, BLOCK_M=32, SPLIT_K=2)), ref)


@pytest.mark.parametrize("shape,pad", [((2, 16, 5, 7), (1, 2)), ((1, 8, 3, 4, 5), (1, 0, 2)), ((2, 24, 9), (3,)),
                                       ((3, 70, 4, 33), (0, 0))], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "cl", "strided"])
def test_the_padded_copy_holds_the_input_zero_padded_in_the_dots_dtype(mods, shape, pad, layout):
    """launch's padded copy (one tiled kernel, any input layout, the border slabs zero-filled) is
    torch's zero padding of x, in dense channels-last memory, rounded to bf16 as torch rounds."""
    mod = mods(False)
    x = _rand(*shape, g=_gen(3))
    if layout == "cl":
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    elif layout == "strided":
        x = _rand(*shape[:-1], 2 * shape[-1], g=_gen(3))[..., ::2]
    flat_pad = [p for p in reversed(pad) for _ in range(2)]
    for dtype in (torch.float32, torch.bfloat16):
        xp = mod._padded_channels_last(x, pad, dtype)
        ref = torch.nn.functional.pad(x, flat_pad).to(dtype)
        assert xp.dtype == dtype and xp.movedim(1, -1).is_contiguous()
        assert torch.equal(xp, ref)


def test_padded_grid_tiles_with_an_epilogue_and_bf16(mods):
    """FLAT feeds the epilogue the output's coordinates; with CAST_BF16 the padded copy is made in
    bf16 (the dots' operands), as are bf16 inputs."""
    mod = mods(False, EPI, name="kw_conv_box_epi")
    x, w = _case(False, 2, 16, 16, (6, 7), (3, 3), 1, seed=7)
    g = _gen(8)
    e0, e1, e2 = _rand(16, g=g), _rand(2, 16, 6, 7, g=g), torch.tensor(0.5)
    tile = dict(TILE, FLAT=1)
    ref = torch.relu((_ref(x, w, False, padding=1) + e0[:, None, None]) * e2 + e1)
    _close(mod.launch(x, w, e0, e1, e2, padding=1, **tile), ref)
    xb, wb = _bf16(x), _bf16(w)
    refb = torch.relu((_ref(xb, wb, False, padding=1) + e0[:, None, None].double()) * e2.double() + e1.double())
    _close(mod.launch(x, w, e0, e1, e2, padding=1, CAST_BF16=True, **tile), refb, tol=1e-3)
    _close(mod.launch(x.bfloat16(), w.bfloat16(), e0, e1, e2, padding=1, out_dtype=torch.float32, **tile), refb, tol=1e-3)


def test_padded_grid_tiles_fall_back_to_gathers_where_they_do_not_apply(mods):
    """A stride-2 or grouped convolution, or channel rows that are no 16-byte multiple, with a FLAT
    config: gathered (same result)."""
    mod = mods(False)
    for (cin, cout, args) in ((16, 16, dict(stride=2, padding=1)), (16, 16, dict(groups=2, padding=1)),
                              (6, 8, dict(padding=1))):
        x, w = _case(False, 2, cin, cout, (6, 7), (3, 3), args.get("groups", 1), seed=cin)
        assert not mod.flat_ok(x, args.get("groups", 1), (args.get("stride", 1),) * 2)
        _close(mod.launch(x, w, **args, **dict(TILE, FLAT=1)), _ref(x, w, False, **args))


def test_a_warp_specialised_box_loop_computes_the_same_values(mods):
    """WARP_SPEC (Hopper's producer / consumer warps: the sm_90 compile test shows them; the
    interpreter runs the loop as written) with an epilogue, NCHW and channels-last outputs; refused
    with two-row boxes, split K and for transposed convolutions."""
    mod = mods(False, EPI, name="kw_conv_box_epi")
    x, w = _case(False, 2, 16, 16, (6, 7), (3, 3), 1, seed=11)
    g = _gen(12)
    e0, e1, e2 = _rand(16, g=g), _rand(2, 16, 6, 7, g=g), torch.tensor(0.5)
    ref = torch.relu((_ref(x, w, False, padding=1) + e0[:, None, None].double()) * e2.double() + e1.double())
    tile = dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=1, BOX_W=16, WARP_SPEC=1, num_warps=4)
    _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, **tile), ref)
    _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, out_channels_last=True, **tile), ref)
    with pytest.raises(ValueError, match="WARP_SPEC is for the one-box loop"):
        mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, **dict(tile, BLOCK_M=32, BOX_H=2, TWO_ROWS=1))
    with pytest.raises(ValueError, match="WARP_SPEC is for the one-box loop"):
        mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, **dict(tile, SPLIT_K=2))
    xt, wt = _case(True, 1, 16, 16, (4, 4), (3, 3), 1, seed=13)
    with pytest.raises(ValueError, match="not a transposed convolution"):
        mods(True).launch(_channels_last(xt), wt, stride=2, padding=1, **dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=1, BOX_W=16,
                                                                             WARP_SPEC=1))


def test_persistent_programs_loop_over_every_tile(mods, tmp_path):
    """PERSIST: fewer programs than tiles (two per "SM" off CUDA), each looping over tiles
    program_id, + programs, ...: box, two-row box, padded-grid and gathered tiles with an epilogue
    (NaN-poisoned outputs: a tile no program computes fails); pooled tiles, and
    statistics partials equal to one program per tile's; refused with split K, WARP_SPEC and a
    transposed convolution's phase classes."""
    mod = mods(False, EPI, name="kw_conv_box_epi")
    x, w = _case(False, 2, 16, 16, (6, 9), (3, 3), 1, seed=17)
    g = _gen(18)
    e0, e1, e2 = _rand(16, g=g), _rand(2, 16, 6, 9, g=g), torch.tensor(0.5)
    ref = torch.relu((_ref(x, w, False, padding=1) + e0[:, None, None].double()) * e2.double() + e1.double())
    box = dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8)
    # (the interpreter runs a flattened loop as written: FLATTEN=0 differs only when compiled)
    for tile in (box, dict(box, TWO_ROWS=1, BLOCK_M=32, BOX_W=16), dict(TILE, FLAT=1), TILE):
        _close(mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, PERSIST=1, **tile), ref)
    _close(mod.launch(x, w, e0, e1, e2, padding=1, out_channels_last=True, PERSIST=2, **box), ref)
    for bad in (dict(SPLIT_K=2), dict(WARP_SPEC=1)):
        with pytest.raises(ValueError, match="PERSIST loops over the tiles of one launch"):
            mod.launch(_channels_last(x), w, e0, e1, e2, padding=1, PERSIST=1, **dict(box, **bad))
    xt, wt = _case(True, 1, 16, 16, (4, 4), (3, 3), 1, seed=19)
    with pytest.raises(ValueError, match="PERSIST loops over the tiles of one launch"):
        mods(True).launch(_channels_last(xt), wt, stride=2, padding=1, PERSIST=1, **box)
    _close(mods(True).launch(_channels_last(xt), wt, padding=1, PERSIST=1, **box), _ref(xt, wt, True, padding=1))
    pmod = load_module_from_source(render_conv(name="kw_conv_pool", pool="max"), "kw_conv_pool", tmp_path)
    _close(pmod.launch(x, w, padding=1, pool_window=2, PERSIST=1, **dict(TILE, BLOCK_M=16)),
           torch.nn.functional.max_pool2d(_ref(x, w, False, padding=1), 2))
    smod = load_module_from_source(render_conv(name="kw_conv_stats", stats=True), "kw_conv_stats", tmp_path)
    y, cnt, mean, m2 = smod.launch(_channels_last(x), w, padding=1, PERSIST=1, **box)
    plain = smod.launch(_channels_last(x), w, padding=1, **box)
    _close(y, _ref(x, w, False, padding=1))
    for a, b in zip((cnt, mean, m2), plain[1:]):
        assert torch.equal(a, b)


def test_box_config_errors_and_ineligible_convolutions(mods):
    mod = mods(False)
    x, w = _case(False, 1, 16, 16, (6, 6), (3, 3), 1, seed=3)
    xcl = _channels_last(x)
    with pytest.raises(ValueError, match="must hold BLOCK_M"):
        mod.launch(xcl, w, padding=1, **dict(TILE, BOX_D=1, BOX_H=2, BOX_W=16))
    with pytest.raises(ValueError, match="TWO_ROWS needs a box of two rows"):
        mod.launch(xcl, w, padding=1, **dict(TILE, BOX_D=1, BOX_H=1, BOX_W=16, TWO_ROWS=1))
    with pytest.raises(ValueError, match="TWO_ROWS needs a box of two rows"):  # rows below tl.dot's 16
        mod.launch(xcl, w, padding=1, **dict(TILE, BOX_D=1, BOX_H=2, BOX_W=8, TWO_ROWS=1))
    assert mod.tma_box_ok(xcl, 2, (1, 1)) is None and mod.tma_box_ok(xcl, 1, (2, 1)) is None
    assert mod.tma_box_ok(_channels_last(x[:, :6]), 1, (1, 1)) is None  # 24-byte channel rows
    tile = dict(TILE, BOX_D=1, BOX_H=2, BOX_W=8)  # a stride-2 convolution with a box config: gathered
    _close(mod.launch(xcl, w, stride=2, padding=1, **tile), _ref(x, w, False, stride=2, padding=1))


def test_weight_layouts_and_out_channels_last(mods):
    """A weight read through its strides (few pixel tiles) and one copied K-major (many), and
    channels-last outputs, give the same values."""
    g = _gen(3)
    for transposed in (False, True):
        x = _rand(2, 8, 5, 5, g=g)
        w = _rand(8, 6, 3, 3, g=g) if transposed else _rand(6, 8, 3, 3, g=g)
        args = dict(stride=2, padding=1, output_padding=1) if transposed else dict(padding=1)
        ref = _ref(x, w, transposed, **args)
        mod = mods(transposed)
        for tile_m in (16, 128):  # 4+ tiles of 16 copy the weight, one tile of 128 does not
            out = mod.launch(x, w, **args, **dict(TILE, BLOCK_M=tile_m))
            _close(out, ref)
            assert out.is_contiguous()
        out = mod.launch(_channels_last(x), w, **args, out_channels_last=True, **TILE)
        _close(out, ref)
        assert out.is_contiguous(memory_format=torch.channels_last)
    x3, w3 = _case(True, 1, 3, 4, (3, 2, 3), (2, 2, 2), 1, seed=4)
    out = mods(True).launch(x3, w3, stride=2, out_channels_last=True, **TILE)
    _close(out, _ref(x3, w3, True, stride=2))
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    x1, w1 = _case(False, 2, 4, 5, (9,), (3,), 1, seed=5)
    out = mods(False).launch(x1, w1, padding=1, out_channels_last=True, **TILE)
    _close(out, _ref(x1, w1, False, padding=1))
    assert out.stride(1) == 1


EPI = Epilogue(
    (EpilogueOperand("e0", "col"), EpilogueOperand("e1", "full"), EpilogueOperand("e2", "scalar")),
    "acc = (acc + e0) * e2 + e1\nacc = tl.maximum(acc, 0.0)",
)


@pytest.mark.parametrize("transposed,nd,ocl", [(False, 2, False), (False, 1, True), (True, 2, True),
                                                (True, 3, False)])
def test_epilogue_col_full_scalar(mods, transposed, nd, ocl):
    """bias (col), a residual broadcast over one dim (full, a stride-0 dim) and a scale (scalar),
    then ReLU, over groups of 2."""
    g = _gen(6 + nd)
    size = {1: (9,), 2: (5, 4), 3: (2, 3, 2)}[nd]
    kernel = {1: (3,), 2: (3, 2), 3: (2, 2, 1)}[nd]
    args = dict(stride=2, padding=1, groups=2) | (dict(output_padding=1) if transposed else {})
    x, w = _case(transposed, 2, 4, 6, size, kernel, 2, seed=nd)
    conv = _ref(x, w, transposed, **args)
    bias = _rand(6, g=g)
    res = _rand(conv.shape[0], 1, *conv.shape[2:], g=g).expand(conv.shape)  # stride 0 along channels
    scale = torch.tensor(0.5, device=DEVICE)
    ref = torch.relu((conv + bias.view(1, 6, *[1] * nd)) * scale + res)
    out = mods(transposed, EPI).launch(x, w, bias, res, scale, **args, out_channels_last=ocl, **TILE)
    _close(out, ref)
    if nd != 2:
        return
    # a residual given with fewer dims (broadcast along batch) is expanded by the launcher
    res1 = _rand(*conv.shape[1:], g=g)
    _close(mods(transposed, EPI).launch(x, w, bias, res1, scale, **args, **TILE),
           torch.relu((conv + bias.view(1, 6, *[1] * nd)) * scale + res1))


def _bf16(t):
    return t.bfloat16().double()


@pytest.mark.parametrize("transposed", [False, True])
def test_bf16(mods, transposed):
    """CAST_BF16 rounds float32 tiles to bf16 (products exact in float32); bf16 tensors in and out."""
    x, w = _case(transposed, 2, 6, 4, (4, 5), (3, 3), 2, seed=11)
    args = dict(stride=2, padding=1, groups=2)
    ref = _ref(_bf16(x), _bf16(w), transposed, **args)
    mod = mods(transposed)
    _close(mod.launch(x, w, **args, CAST_BF16=True, **TILE), ref, tol=1e-4)
    out = mod.launch(x.bfloat16(), w.bfloat16(), **args, **TILE)
    assert out.dtype == torch.bfloat16
    _close(out, ref, tol=1e-2)
    out = mod.launch(x.bfloat16(), w.bfloat16(), **args, out_dtype=torch.float32, **TILE)
    _close(out, ref, tol=1e-4)


# the input's prologue: an eval-mode batch norm and a ReLU, scaled (col and scalar operands)
PROLOGUE = Epilogue((EpilogueOperand("p0", "col"), EpilogueOperand("p1", "col"), EpilogueOperand("p2", "scalar")),
                    "acc = tl.maximum(acc * p0 + p1, 0.0) * p2")
# (transposed, batch, Cin, Cout, spatial, kernel, conv args, tile): the folded-tap, per-tap and box
# K loops, grouped, transposed and 3-D
PROLOGUE_CASES = {
    "fold-pad": (False, 2, 3, 5, (7, 6), (3, 3), dict(padding=1), TILE),
    "per-tap-dil": (False, 1, 32, 8, (6, 7), (3, 3), dict(padding=2, dilation=2), TILE),
    "box": (False, 2, 16, 16, (5, 9), (3, 3), dict(padding=1),
            dict(TILE, BLOCK_M=16, BOX_D=1, BOX_H=2, BOX_W=8, INPUT_PRECISION="tf32")),
    "grouped-stride2": (False, 2, 6, 4, (7, 7), (3, 3), dict(stride=2, padding=1, groups=2), TILE),
    "transposed": (True, 1, 4, 5, (4, 5), (3, 3), dict(stride=2, padding=1, output_padding=1), TILE),
    "3d": (False, 1, 3, 4, (4, 5, 3), (3, 3, 2), dict(padding=1), TILE),
}


@pytest.mark.parametrize("layout", ["nchw", "cl"])
@pytest.mark.parametrize("case", list(PROLOGUE_CASES), ids=str)
def test_input_prologue(mods, case, layout):
    """A prologue applies to the input's values as they are loaded and before the zero padding
    (here the prologue of 0 is not 0, so padding taps would show it), per input channel across
    groups; bf16 tensors round its result to bf16, as the graph's bf16 value is."""
    transposed, batch, cin, cout, size, kernel, args, tile = PROLOGUE_CASES[case]
    x, w = _case(transposed, batch, cin, cout, size, kernel, args.get("groups", 1), seed=len(case) + 3)
    g = _gen(5)
    scale, shift, k = _rand(cin, g=g), _rand(cin, g=g).abs() + 0.5, torch.tensor(1.5)
    view = (cin,) + (1,) * (x.dim() - 2)
    pre = torch.relu(x * scale.view(view) + shift.view(view)) * k
    ref = _ref(pre, w, transposed, **args)
    if layout == "cl":
        x = _channels_last(x)
    mod = mods(transposed, prologue=PROLOGUE, name="kw_conv_pro")
    _close(mod.launch(x, w, **args, prologue_operands=(scale, shift, k), **tile), ref, tol=2e-3 if "BOX_W" in tile else TOL)
    if case == "box":  # float32 tensors rounded in the kernel: the prologue computes on x's own values
        out = mod.launch(x, w, **args, prologue_operands=(scale, shift, k), **tile, CAST_BF16=True)
        _close(out, _ref(_bf16(pre), _bf16(w), transposed, **args), tol=1e-4)
    if case == "per-tap-dil":
        out = mod.launch(x.bfloat16(), w.bfloat16(), **args, prologue_operands=(scale, shift, k), **tile,
                         out_dtype=torch.float32)
        pre16 = torch.relu(_bf16(x).float() * scale.view(view) + shift.view(view)) * k  # (from bf16 x values)
        _close(out, _ref(_bf16(pre16), _bf16(w), transposed, **args), tol=1e-3)
        with pytest.raises(ValueError, match="prologue operand"):
            mod.launch(x, w, **args, prologue_operands=(scale, shift), **tile)
        with pytest.raises(ValueError, match="input channels"):
            mod.launch(x, w, **args, prologue_operands=(scale[:3], shift, k), **tile)


# (batch, Cin, Cout, spatial, conv kernel, conv args, pool window, pool padding): the input max-pooled
# at stride 1 as it is loaded (an Inception module's pool branch)
IN_POOL = {
    "3x3-then-1x1": (2, 32, 20, (5, 6), (1, 1), {}, (1, 3, 3), (0, 1, 1)),
    "3x3-then-3x3-padded": (1, 16, 8, (4, 7), (3, 3), dict(padding=1, dilation=(1, 2)), (1, 3, 3), (0, 1, 1)),
    "3d-3x3x3-then-1x1": (1, 16, 4, (3, 4, 5), (1, 1, 1), {}, (3, 3, 3), (1, 1, 1)),
}


@pytest.mark.parametrize("layout", ["nchw", "cl"])
@pytest.mark.parametrize("case", list(IN_POOL), ids=str)
def test_input_max_pool(mods, case, layout):
    """The window's max as the input is loaded equals max-pooling first (the pool's -inf padding at
    the input's edges, the convolution's zero padding past them); NaN propagates; boxes and folded
    taps are refused."""
    batch, cin, cout, size, kernel, args, window, pad = IN_POOL[case]
    x, w = _case(False, batch, cin, cout, size, kernel, 1, seed=len(case))
    x[0, 1, 0, 0] = float("nan")
    nd = len(size)
    pool = torch.nn.functional.max_pool2d if nd == 2 else torch.nn.functional.max_pool3d
    win, pd = (window, pad) if nd == 3 else (window[1:], pad[1:])
    ref = _ref(pool(x, win, 1, pd), w, False, **args)
    if layout == "cl":
        x = _channels_last(x)
    mod = mods(in_pool=(window, pad), name="kw_conv_pool")
    out = mod.launch(x, w, **args, **TILE)
    assert out.isnan().any() and torch.equal(out.isnan(), ref.isnan())
    _close(torch.nan_to_num(out), torch.nan_to_num(ref))
    with pytest.raises(ValueError, match="input pool"):
        mod.launch(x, w, **args, **dict(TILE, BLOCK_K=64))  # more K than channels: folded taps


def test_input_pool_errors():
    with pytest.raises(ValueError, match="odd windows"):
        render_conv(in_pool=((1, 2, 2), (0, 1, 1)))
    with pytest.raises(ValueError, match="without a prologue"):
        render_conv(in_pool=((1, 3, 3), (0, 1, 1)), transposed=True)


# (transposed, batch, Cin, Cout, spatial, kernel, conv args, tile, SPLIT_K): the per-tap, folded-tap
# and box K loops, grouped and transposed, splits with no K step left (3 steps, 4 splits)
SPLITS = {
    "per-tap": (False, 2, 32, 20, (5, 6), (3, 3), dict(stride=2, padding=1), TILE, 4),
    "fold-grouped": (False, 1, 6, 4, (7, 7), (3, 3), dict(padding=1, groups=2), TILE, 3),
    "box": (False, 1, 16, 16, (6, 9), (3, 3), dict(padding=1),
            dict(TILE, BOX_D=1, BOX_H=2, BOX_W=8, INPUT_PRECISION="tf32"), 2),
    "transposed": (True, 2, 4, 5, (4, 5), (3, 3), dict(stride=2, padding=1, output_padding=1), TILE, 2),
    "more-splits-than-steps": (False, 1, 16, 8, (4, 4), (1, 3), dict(padding=(0, 1)), TILE, 4),
}


@pytest.mark.parametrize("case", list(SPLITS), ids=str)
def test_split_k_sums_its_partial_tiles(mods, case):
    """SPLIT_K shares each tile's K steps among programs writing float32 partial tiles; a second
    launch sums them and applies the epilogue: the same result as the unsplit kernel (to float32
    rounding of the order of the sum)."""
    transposed, batch, cin, cout, size, kernel, args, tile, split = SPLITS[case]
    x, w = _case(transposed, batch, cin, cout, size, kernel, args.get("groups", 1), seed=len(case))
    e0 = _rand(cout, g=_gen(9))
    ref = _ref(x, w, transposed, **args) + e0.view(1, -1, *([1] * len(size)))
    bias = Epilogue((EpilogueOperand("e0", "col"),), "acc = acc + e0")
    out = mods(transposed, bias).launch(_channels_last(x), w, e0, **args, **tile, SPLIT_K=split)
    _close(out, ref, tol=2e-3 if "BOX_W" in tile else TOL)


@pytest.mark.parametrize("transposed", [False, True])
def test_space_configs_run(mods, transposed):
    """The first configs of conv_space (tensor-core sized tiles) compute the same convolution."""
    batch, cin, cout, size, kernel = 2, 16, 24, (6, 6), (3, 3)
    args = dict(stride=2, padding=1) | (dict(output_padding=1) if transposed else {})
    x, w = _case(transposed, batch, cin, cout, size, kernel, 1, seed=12)
    ref = _ref(x, w, transposed, **args)
    M = ref.shape[0] * ref[0, 0].numel()
    configs = conv_space(M=M, N=cout, K=cin * 9, channels=cin, precision="fp32", elem_bytes=4, spec=H200)
    for cfg in configs[:3]:
        _close(mods(transposed).launch(_channels_last(x), w, **args, **cfg), ref)


def test_errors(mods):
    with pytest.raises(ValueError, match="row"):
        render_conv(Epilogue((EpilogueOperand("e0", "row"),), "acc = acc + e0"))
    with pytest.raises(ValueError, match="prologue"):
        render_conv(prologue=Epilogue((EpilogueOperand("p0", "full"),), "acc = acc + p0"))
    x, w = _case(False, 1, 4, 4, (5, 5), (3, 3), 1, seed=0)
    mod = mods(False)
    with pytest.raises(ValueError, match="groups"):
        mod.launch(x, w, groups=3)
    with pytest.raises(ValueError, match="string"):
        mod.launch(x, w, padding="same")
    with pytest.raises(ValueError, match="SPLIT_K"):
        mod.launch(x, w, SPLIT_K=0)
    with pytest.raises(ValueError, match="empty output"):
        mod.launch(x, w, dilation=3)
    with pytest.raises(ValueError, match="epilogue operand"):
        mods(False, EPI).launch(x, w)
    with pytest.raises(ValueError, match="output_padding"):
        mods(True).launch(x, w, stride=2, output_padding=2)


# (batch, Cin, Cout, spatial, kernel, conv args, BLOCK_K): small-channel convolutions whose input rows
# (KW taps x Cin channels, contiguous in channels-last memory) fit one K step
ROWS = {
    "8ch-3x3-pad": (2, 8, 6, (7, 9), (3, 3), dict(padding=1), 32),
    "stem-7x7-s2": (1, 3, 5, (9, 8), (7, 7), dict(stride=2, padding=3), 32),
    "1d-s2": (2, 4, 5, (11,), (5,), dict(stride=2, padding=2), 32),
    "3d-dil-d": (1, 4, 3, (4, 5, 6), (3, 3, 3), dict(padding=1, dilation=(2, 1, 1)), 16),
}


def test_rows_that_fill_less_than_half_a_k_step_fold_their_taps(mods):
    """A 3x3 RGB stem's rows (9 values) fill 9 of a 32-wide K step: its taps fold instead; a 7x7
    stem's (21) and an 8-channel 3x3 convolution's (24) read rows."""
    mod = mods(False)
    assert mod._row_channels(3, 1, 3, 1, 32) == 0 and mod._row_channels(3, 1, 3, 1, 16) == 3
    assert mod._row_channels(3, 1, 7, 1, 32) == 3 and mod._row_channels(8, 1, 3, 1, 32) == 8
    assert mod._row_channels(8, 2, 3, 1, 32) == 0 and mod._row_channels(8, 1, 3, 2, 32) == 0  # groups, dilation


@pytest.mark.parametrize("case", list(ROWS), ids=str)
def test_input_rows_as_k_steps(mods, case, monkeypatch):
    """With one group, dilation 1 along w and KW x Cin <= BLOCK_K, each K step reads one input row
    per pixel (ROW_C; x and w copied channels-last where they are not, channels padded with zeros
    to 16-byte rows where the row still fits): the convolution's result, padding included, with an
    epilogue, split K, a prologue and bf16 operands."""
    batch, cin, cout, size, kernel, args, bk = ROWS[case]
    x, w = _case(False, batch, cin, cout, size, kernel, 1, seed=len(case) + 11)
    ref = _ref(x, w, False, **args)
    tile = dict(TILE, BLOCK_K=bk)
    mod = mods(False)
    rows = []
    real = mod._row_align
    monkeypatch.setattr(mod, "_row_align", lambda t: rows.append(real(t)) or rows[-1])
    xc, wc = _channels_last(x), _channels_last(w)
    _close(mod.launch(xc, wc, **args, **tile), ref)
    # (pixels' offsets in x, channels' in w: multiples of Cin; 3 channels are padded to 4 with zero channels)
    assert rows == [4 if cin == 3 else cin] * 2
    _close(mod.launch(x, w, **args, **tile), ref)  # NCHW x and w: copied channels-last first
    assert len(rows) == 4 and rows[2] == rows[0]
    e0 = _rand(cout, g=_gen(4))
    bias = Epilogue((EpilogueOperand("e0", "col"),), "acc = acc + e0")
    monkeypatch.setattr(mods(False, bias), "_row_align", lambda t: rows.append(real(t)) or rows[-1])
    _close(mods(False, bias).launch(xc, wc, e0, **args, **tile, SPLIT_K=2),
           ref + e0.view(1, -1, *([1] * len(size))))
    assert len(rows) == 6
    g = _gen(6)
    scale, shift, k = _rand(cin, g=g), _rand(cin, g=g).abs() + 0.5, torch.tensor(1.5)
    view = (cin,) + (1,) * len(size)
    pre = torch.relu(x * scale.view(view) + shift.view(view)) * k
    _close(mods(False, prologue=PROLOGUE, name="kw_conv_pro").launch(xc, wc, **args, prologue_operands=(scale, shift, k),
                                                                     **tile), _ref(pre, w, False, **args))
    out = mod.launch(xc.bfloat16(), wc.bfloat16(), **args, out_dtype=torch.float32, **tile)
    _close(out, _ref(_bf16(x), _bf16(w), False, **args), tol=1e-4)
