"""Triton GEMM / conv templates with fused epilogues, run by Triton's interpreter on the CPU."""
import os

import pytest
import torch
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.codegen.epilogue import (
    IDENTITY,
    Epilogue,
    EpilogueOperand,
    bias_relu,
    render_operand_loads,
)
from kernelwright.analyze.device import H200
from kernelwright.codegen.triton_gemm import (
    precision_kwargs,
    render_conv2d,
    render_depthwise,
    render_gemm,
    render_gemm_rowreduce,
)
from kernelwright.space.gemm_space import (
    CONFIG_KEYS,
    conv_space,
    depthwise_space,
    gemm_space,
    rowreduce_space,
)

# The same tests run compiled on a GPU with KW_TRITON_TEST_DEVICE=cuda and TRITON_INTERPRET unset (tests/conftest.py
# switches the interpreter on only on a machine without a GPU); on CPU tensors they need the interpreter.
DEVICE = os.environ.get("KW_TRITON_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.interpreter if DEVICE == "cpu" else pytest.mark.gpu
if DEVICE == "cuda":  # references in IEEE float32: no TF32 in cuBLAS / cuDNN
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
TILE = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)
ATOL = 1e-4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kwgen")


def _load(text, name, cache):
    return load_module_from_source(text, name, cache)


def _close(out, ref, tol=ATOL):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = (out.double() - ref.double()).abs().max().item()
    assert torch.allclose(out.double(), ref.double(), atol=tol, rtol=tol), err


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _rand(*shape, g):
    return torch.randn(*shape, generator=g).to(DEVICE)


# ----------------------------------------------------------------------------- GEMM

def test_plain_gemm_ieee_and_transposes(cache):
    mod = _load(render_gemm(IDENTITY), "gemm_plain", cache)
    g = _gen(1)
    a, b = _rand(40, 56, g=g), _rand(56, 36, g=g)
    _close(mod.launch(a, b, **TILE, INPUT_PRECISION="ieee"), a @ b)
    # EVEN_K path and a tile larger than the problem
    a2, b2 = _rand(20, 32, g=g), _rand(32, 24, g=g)
    _close(mod.launch(a2, b2, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=8), a2 @ b2)
    # B given as a transposed view (nn.Linear: x @ weight.T) and A transposed: no copies
    w = _rand(36, 56, g=g)
    _close(mod.launch(a, w.T, **TILE), a @ w.T)
    at = _rand(56, 40, g=g)
    _close(mod.launch(at.T, w.T, **TILE), at.T @ w.T)
    _close(mod.launch(at.T, b, **TILE, KMAJOR=True), at.T @ b)  # copies both to K-major


def test_kmajor_relayout_is_a_tiled_transpose(cache):
    """KMAJOR copies go through the template's tiled relayout kernel: same values, unit stride
    along K (B's rows, A's columns), 2-D and batched, sizes that are not multiples of the tile."""
    g = _gen(7)
    mod = _load(render_gemm(IDENTITY), "gemm_plain", cache)
    b = _rand(70, 90, g=g)  # row-major [K, N]
    kb = mod._relayout(b, k_rows=True)
    assert kb.stride() == (1, 70) and torch.equal(kb, b)
    a_cm = _rand(90, 70, g=g).T  # [M, K] column-major
    ka = mod._relayout(a_cm, k_rows=False)
    assert ka.is_contiguous() and torch.equal(ka, a_cm)
    bb = _rand(3, 20, 33, g=g)
    kbb = mod._relayout(bb, k_rows=True)
    assert kbb.stride() == (660, 1, 20) and torch.equal(kbb, bb)
    bmm = _load(render_gemm(IDENTITY, batched=True), "bmm", cache)
    a3 = _rand(3, 17, 20, g=g)
    _close(bmm.launch(a3, bb, **TILE, KMAJOR=True), a3 @ bb)


def test_split_k(cache):
    g = _gen(2)
    a, b, bias = _rand(24, 96, g=g), _rand(96, 20, g=g), _rand(20, g=g)
    plain = _load(render_gemm(IDENTITY), "gemm_plain", cache)
    _close(plain.launch(a, b, **TILE | {"SPLIT_K": 3}), a @ b)
    fused = _load(render_gemm(bias_relu()), "gemm_bias_relu", cache)
    _close(fused.launch(a, b, bias, **TILE | {"SPLIT_K": 2}), torch.relu(a @ b + bias))


def test_bmm_and_broadcast(cache):
    g = _gen(3)
    mod = _load(render_gemm(IDENTITY, batched=True), "bmm", cache)
    a, b = _rand(3, 20, 24, g=g), _rand(3, 24, 28, g=g)
    _close(mod.launch(a, b, **TILE), torch.bmm(a, b))
    bt = _rand(3, 28, 24, g=g).transpose(1, 2)  # transposed per batch
    _close(mod.launch(a, bt, **TILE), torch.bmm(a, bt))
    w = _rand(24, 28, g=g)  # one B for every batch (stride 0)
    _close(mod.launch(a, w, **TILE), a @ w)


def test_gemm_epilogues(cache):
    g = _gen(4)
    M, N, K = 36, 40, 24
    a, b = _rand(M, K, g=g), _rand(K, N, g=g)
    bias, rs, res = _rand(N, g=g), _rand(M, g=g), _rand(M, N, g=g)
    s = torch.tensor(0.75, device=DEVICE)
    ep = Epilogue(
        (EpilogueOperand("e0", "col"), EpilogueOperand("e1", "row"), EpilogueOperand("e2", "full"),
         EpilogueOperand("e3", "scalar")),
        "acc = acc + e0\nacc = tl.maximum(acc, 0.0)\nacc = acc * e1\nacc = acc + e2\nacc = acc * e3",
    )
    mod = _load(render_gemm(ep), "gemm_epi4", cache)
    ref = (torch.relu(a @ b + bias) * rs[:, None] + res) * 0.75
    _close(mod.launch(a, b, bias, rs, res, s, **TILE), ref)
    # a broadcast "full" operand ([1, N] expanded, stride 0) and a Python-number scalar
    _close(mod.launch(a, b, bias, rs, bias[None, :], 2.0, **TILE), (torch.relu(a @ b + bias) * rs[:, None] + bias) * 2)
    # bias + exact GELU (multi-line code; tl.erf; the interpreter cannot run libdevice calls)
    ep2 = Epilogue((EpilogueOperand("bias", "col"),),
                   "acc = acc + bias\nacc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))")
    mod2 = _load(render_gemm(ep2), "gemm_gelu", cache)
    _close(mod2.launch(a, b, bias, **TILE), F.gelu(a @ b + bias))


def test_batched_epilogue(cache):
    g = _gen(5)
    B, M, N, K = 2, 20, 24, 16
    a, b = _rand(B, M, K, g=g), _rand(B, K, N, g=g)
    bias_b, rs, res = _rand(B, N, g=g), _rand(M, g=g), _rand(B, M, N, g=g)
    ep = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "row"), EpilogueOperand("e2", "full")),
                  "acc = (acc + e0) * e1 + e2")
    mod = _load(render_gemm(ep, batched=True), "bmm_epi", cache)
    ref = (torch.bmm(a, b) + bias_b[:, None, :]) * rs[None, :, None] + res
    _close(mod.launch(a, b, bias_b, rs, res, **TILE), ref)


def test_tf32_flag_and_out_dtype(cache):
    g = _gen(6)
    a, b = _rand(32, 32, g=g), _rand(32, 16, g=g)
    mod = _load(render_gemm(IDENTITY), "gemm_plain", cache)
    _close(mod.launch(a, b, **TILE, **precision_kwargs("tf32")), a @ b, tol=1e-2)
    out = mod.launch(a, b, **TILE, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    _close(out.float(), a @ b, tol=2e-2)


@pytest.mark.parametrize("a_dtype,b_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.bfloat16, torch.bfloat16)])
def test_bf16_cast(cache, a_dtype, b_dtype):
    """CAST_BF16 rounds float32 tiles to bf16 in the kernel; operands may already be bf16, or one
    of each (a fused GEMM that absorbed one operand's cast). In the interpreter, whose bf16 dot is
    broken (Triton 3.6), the template widens the rounded tiles to an exact float32 dot."""
    g = _gen(6)
    a, b = _rand(32, 32, g=g), _rand(32, 16, g=g).t().contiguous().t()  # B K-major, like W.T
    mod = _load(render_gemm(IDENTITY), "gemm_plain", cache)
    ref = a.bfloat16().float() @ b.bfloat16().float()
    out = mod.launch(a.to(a_dtype), b.to(b_dtype), **TILE, **precision_kwargs("bf16"))
    assert out.dtype == a_dtype
    _close(out.float(), ref, tol=1e-2)
    with pytest.raises(ValueError, match="CAST_BF16"):
        mod.launch(a.bfloat16(), b, **TILE)


# ----------------------------------------------------------------------------- GEMM + row reduction

@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "logsumexp", "softmax"])
def test_gemm_rowreduce(cache, reduce):
    g = _gen(7)
    M, N, K = 20, 40, 24
    a, b, bias = _rand(M, K, g=g), _rand(K, N, g=g), _rand(N, g=g)
    mod = _load(render_gemm_rowreduce(bias_relu()), "gemm_rr", cache)
    z = torch.relu(a @ b + bias)
    ref = {
        "sum": lambda: z.sum(1), "mean": lambda: z.mean(1), "max": lambda: z.amax(1),
        "min": lambda: z.amin(1), "logsumexp": lambda: torch.logsumexp(z, 1),
        "softmax": lambda: torch.softmax(z, 1),
    }[reduce]()
    # BLOCK_N=16 < N: the online path walks three column tiles (softmax raises it to 64)
    out = mod.launch(a, b, bias, reduce=reduce, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    _close(out, ref)


def test_gemm_rowreduce_whole_row_modes(cache):
    """"tile" / "tile_row": the epilogue code reduces the whole row itself (what gemm_epilogue
    renders for a layer / group norm): a layer norm with weight and bias over rows of 24 in a
    32-column tile, a group norm over 4 segments of 8 columns (the tile viewed [BLOCK_M, 4, 8]),
    a row variance; rows masked at the edge (M = 20)."""
    g = _gen(9)
    M, K = 20, 24
    a, w, bias = _rand(M, K, g=g), _rand(K, 32, g=g), _rand(32, g=g)
    ln = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "col")), """
m = tl.sum(tl.where(mask, acc, 0.0), axis=1)[:, None] / N
d = acc - m
v = tl.sum(tl.where(mask, d * d, 0.0), axis=1)[:, None] / N
acc = d * tl.rsqrt(v + 1e-5) * e0 + e1""")
    mod = _load(render_gemm_rowreduce(ln), "gemm_rr_tile", cache)
    z = a @ w[:, :24]
    out = mod.launch(a, w[:, :24], bias[:24], bias[8:], reduce="tile", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    _close(out, F.layer_norm(z, (24,), bias[:24], bias[8:]))  # BLOCK_N raised to 32
    gn = Epilogue((EpilogueOperand("e0", "col"),), """
x = tl.reshape(acc + e0, (BLOCK_M, 4, 8))
m = tl.sum(tl.where(row_mask[:, None, None], x, 0.0), axis=2)[:, :, None] / 8
d = x - m
v = tl.sum(tl.where(row_mask[:, None, None], d * d, 0.0), axis=2)[:, :, None] / 8
acc = tl.reshape(d * tl.rsqrt(v + 1e-5), (BLOCK_M, BLOCK_N))""")
    mod = _load(render_gemm_rowreduce(gn), "gemm_rr_tile_gn", cache)
    out = mod.launch(a, w, bias, reduce="tile", BLOCK_M=16, BLOCK_N=32, BLOCK_K=16)
    _close(out, F.group_norm(a @ w + bias, 4).view(M, 32))
    var = Epilogue((), """
m = tl.sum(tl.where(mask, acc, 0.0), axis=1)[:, None] / N
res = tl.sum(tl.sum(tl.where(mask, (acc - m) * (acc - m), 0.0), axis=1)[:, None] / (N - 1), axis=1)""")
    mod = _load(render_gemm_rowreduce(var), "gemm_rr_tile_row", cache)
    _close(mod.launch(a, w[:, :24], reduce="tile_row", BLOCK_M=16, BLOCK_N=32, BLOCK_K=16), z.var(1))


@pytest.mark.parametrize("reduce", ["sum", "logsumexp", "tile"])
def test_gemm_rowreduce_tma(cache, reduce):
    """TMA=True: the row-reduction GEMM loads A and B^T tiles through tensor descriptors (zeros
    past the edges: M = 20, N = 40, K = 24 are not tile multiples) and gives the pointer path's
    result, with the in-kernel bf16 cast too; a B that is not K-major is refused."""
    g = _gen(10)
    a, w = _rand(20, 24, g=g), _rand(40, 24, g=g)
    ep = IDENTITY if reduce != "tile" else Epilogue((), "acc = acc - tl.sum(tl.where(mask, acc, 0.0), axis=1)[:, None] / N")
    mod = _load(render_gemm_rowreduce(ep), f"gemm_rr_tma_{reduce}", cache)
    z = a @ w.t()
    ref = {"sum": lambda y: y.sum(1), "logsumexp": lambda y: torch.logsumexp(y, 1),
           "tile": lambda y: y - y.mean(1, keepdim=True)}[reduce]
    cfg = dict(reduce=reduce, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, TMA=True)
    _close(mod.launch(a, w.t(), **cfg), ref(z))
    _close(mod.launch(a, w.t(), **cfg, CAST_BF16=True), ref(a.bfloat16().float() @ w.t().bfloat16().float()),
           tol=1e-3)
    with pytest.raises(ValueError, match="K-major"):
        mod.launch(a, w.t().contiguous(), **cfg)


def test_gemm_rowreduce_batched(cache):
    g = _gen(8)
    a, b = _rand(2, 12, 16, g=g), _rand(2, 16, 20, g=g)
    mod = _load(render_gemm_rowreduce(IDENTITY, batched=True), "bmm_rr", cache)
    z = torch.bmm(a, b)
    _close(mod.launch(a, b, reduce="logsumexp", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16), torch.logsumexp(z, -1))


# ----------------------------------------------------------------------------- conv2d

CONV_CASES = [
    # (N, C, H, W, Cout, KH, KW, stride, padding, dilation)
    (2, 5, 9, 9, 6, 3, 3, 1, 1, 1),
    (1, 8, 11, 10, 12, 3, 3, 2, 0, 1),
    (2, 4, 10, 9, 8, 3, 3, 1, 2, 2),
    (1, 3, 9, 12, 5, 3, 2, (2, 1), (1, 0), (1, 2)),
    (1, 20, 6, 6, 18, 1, 1, 1, 0, 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_implicit_gemm(cache, case):
    n, c, h, w_, co, kh, kw, st, pad, dil = case
    g = _gen(9)
    x, w, bias = _rand(n, c, h, w_, g=g), _rand(co, c, kh, kw, g=g), _rand(co, g=g)
    mod = _load(render_conv2d(bias_relu()), "conv_bias_relu", cache)
    ref = torch.relu(F.conv2d(x, w, bias, stride=st, padding=pad, dilation=dil))
    out = mod.launch(x, w, bias, stride=st, padding=pad, dilation=dil, **TILE)
    assert out.is_contiguous()
    _close(out, ref)


def test_conv2d_nhwc_and_residual(cache):
    g = _gen(10)
    x, w, bias = _rand(2, 6, 8, 8, g=g), _rand(10, 6, 3, 3, g=g), _rand(10, g=g)
    ref_conv = F.conv2d(x, w, bias, padding=1)
    res = _rand(*ref_conv.shape, g=g)
    ep = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "full")), "acc = acc + e0 + e1")
    mod = _load(render_conv2d(ep), "conv_res", cache)
    ref = ref_conv + res
    xcl = x.contiguous(memory_format=torch.channels_last)
    _close(mod.launch(xcl, w, bias, res, padding=1, **TILE), ref)  # auto: NHWC
    _close(mod.launch(xcl, w, bias, res, padding=1, NHWC=False, **TILE), ref)  # strided read
    _close(mod.launch(x, w, bias, res, padding=1, NHWC=True, **TILE), ref)  # converted
    # residual given channels-last (any strides)
    _close(mod.launch(x, w, bias, res.contiguous(memory_format=torch.channels_last), padding=1, **TILE), ref)


@pytest.mark.parametrize("mult,st,pad,dil", [(1, 1, 1, 1), (1, 2, 0, 1), (2, 1, 2, 2)])
@pytest.mark.parametrize("block_w", [None, 4, 32])
def test_depthwise(cache, mult, st, pad, dil, block_w):
    """Pixel tiles of whole rows (None: OW rounded up), of 4 columns (several tiles per row, the
    last one ragged) and wider than a row (32 > OW: one tile covers a row's worth of columns)."""
    g = _gen(11)
    C = 6
    x, w, bias = _rand(2, C, 10, 9, g=g), _rand(C * mult, 1, 3, 3, g=g), _rand(C * mult, g=g)
    mod = _load(render_depthwise(bias_relu()), "dw_bias_relu", cache)
    ref = torch.relu(F.conv2d(x, w, bias, stride=st, padding=pad, dilation=dil, groups=C))
    _close(mod.launch(x, w, bias, stride=st, padding=pad, dilation=dil, BLOCK_M=32, BLOCK_N=4, BLOCK_W=block_w), ref)


@pytest.mark.parametrize("kh,kw,mult,pad,st_w,dil_w,rows", [
    (3, 3, 1, 1, 1, 1, 4), (3, 3, 2, 0, 2, 1, 3), (3, 3, 1, 2, 1, 2, 8), (2, 3, 1, 0, 1, 1, 4), (5, 1, 2, 2, 1, 1, 3),
    (7, 5, 1, 3, 2, 1, 4)])
def test_depthwise_row_streaming(cache, kh, kw, mult, pad, st_w, dil_w, rows):
    """The row-streaming kernel (ROWS > 0: kernels of 2 to 7 rows and 1 to 7 columns, row stride
    and dilation 1):
    one rolling accumulator per kernel row over the input rows, OH not a multiple of ROWS, several
    column tiles (OW > BLOCK_M), column stride / dilation, padding 0 to 3 (a 7-row kernel over 11
    rows: most rows padded), a channel multiplier; a full epilogue operand read at each output's
    coordinates."""
    g = _gen(15)
    C = 3
    x, w, bias = _rand(2, C, 11, 13, g=g), _rand(C * mult, 1, kh, kw, g=g), _rand(C * mult, g=g)
    conv = F.conv2d(x, w, bias, stride=(1, st_w), padding=pad, dilation=(1, dil_w), groups=C)
    mod = _load(render_depthwise(bias_relu(), rows_kernel=(kh, kw)), f"dw_bias_relu_{kh}_{kw}", cache)
    # channel tiles of 4 over 3 or 6 channels: the last one ragged
    out = mod.launch(x, w, bias, stride=(1, st_w), padding=pad, dilation=(1, dil_w), BLOCK_M=8, BLOCK_N=4, ROWS=rows)
    _close(out, torch.relu(conv))
    res = _rand(*conv.shape, g=g)
    ep = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "full")), "acc = acc + e0 + e1")
    mod2 = _load(render_depthwise(ep, rows_kernel=(kh, kw)), f"dw_col_full_{kh}_{kw}", cache)
    _close(mod2.launch(x, w, bias, res, stride=(1, st_w), padding=pad, dilation=(1, dil_w), BLOCK_M=8, BLOCK_N=4,
                       ROWS=rows), conv + res)


def test_depthwise_row_streaming_refuses_other_kernels(cache):
    """A module's row-streaming kernel serves the kernel shape it was rendered for, at row stride
    and dilation 1; a module rendered without one says so; shapes outside 2..7 x 1..7 are not
    rendered."""
    g = _gen(16)
    mod = _load(render_depthwise(), "dw_plain", cache)
    x = _rand(1, 2, 8, 8, g=g)
    with pytest.raises(ValueError, match="3 x 3 kernel"):
        mod.launch(x, _rand(2, 1, 5, 5, g=g), padding=2, ROWS=4)
    with pytest.raises(ValueError, match="3 x 3 kernel"):
        mod.launch(x, _rand(2, 1, 3, 5, g=g), padding=1, ROWS=4)
    with pytest.raises(ValueError, match="3 x 3 kernel"):
        mod.launch(x, _rand(2, 1, 3, 3, g=g), stride=2, ROWS=4)
    text = render_depthwise(rows_kernel=None)
    assert "_rows_kernel" not in text
    with pytest.raises(ValueError, match="no row-streaming kernel"):
        _load(text, "dw_norows", cache).launch(x, _rand(2, 1, 3, 3, g=g), padding=1, ROWS=4)
    for kernel in ((1, 3), (8, 3), (3, 8)):
        with pytest.raises(ValueError, match="2 to 7 kernel rows"):
            render_depthwise(rows_kernel=kernel)


def test_depthwise_full_operand_and_strided_input(cache):
    """A "full" epilogue operand is read at each output pixel's (n, c, oh, ow) from the 2-D tile's
    coordinates; the input may be any view (here a channels-last one)."""
    g = _gen(12)
    C = 5
    x, w, res = _rand(3, C, 7, 11, g=g), _rand(C, 1, 3, 3, g=g), _rand(3, C, 7, 11, g=g)
    mod = _load(render_depthwise(Epilogue((EpilogueOperand("e0", "full"),), "acc = acc + e0")), "dw_res", cache)
    ref = F.conv2d(x, w, None, padding=1, groups=C) + res
    xcl = x.contiguous(memory_format=torch.channels_last)
    _close(mod.launch(xcl, w, res, padding=1, BLOCK_M=16, BLOCK_N=4, BLOCK_W=8), ref)  # 5 channels: a ragged tile
    with pytest.raises(ValueError, match="powers of two"):
        mod.launch(x, w, res, padding=1, BLOCK_M=16, BLOCK_N=2, BLOCK_W=6)


def test_bf16_results_round_to_nearest_even(cache):
    """A bf16 result of the GEMM, row-reduction GEMM, implicit-GEMM conv and depthwise templates is
    float32 rounded once to nearest even, compiled or interpreted (the interpreter's own cast
    truncates: about half of these outputs would then differ by one bf16 step)."""
    g = _gen(14)
    a, b = _rand(48, 40, g=g), _rand(40, 24, g=g)
    x, w = _rand(2, 3, 9, 9, g=g), _rand(5, 3, 3, 3, g=g)
    xd, wd = _rand(2, 4, 9, 9, g=g), _rand(4, 1, 3, 3, g=g)
    cases = [
        (_load(render_gemm(), "g_plain", cache).launch(a, b, out_dtype=torch.bfloat16, **TILE), a.double() @ b.double()),
        (_load(render_gemm_rowreduce(), "rr_plain", cache).launch(
            a, b, reduce="sum", out_dtype=torch.bfloat16, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16),
         (a.double() @ b.double()).sum(1)),
        (_load(render_gemm_rowreduce(), "rr_plain", cache).launch(
            a, b, reduce="softmax", out_dtype=torch.bfloat16, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16),
         torch.softmax(a.double() @ b.double(), 1)),
        (_load(render_conv2d(), "c_plain", cache).launch(x, w, padding=1, out_dtype=torch.bfloat16, **TILE),
         F.conv2d(x.double(), w.double(), padding=1)),
        (_load(render_depthwise(), "dw_plain", cache).launch(xd, wd, padding=1, out_dtype=torch.bfloat16, BLOCK_M=64, BLOCK_N=2),
         F.conv2d(xd.double(), wd.double(), padding=1, groups=4)),
    ]
    for got, ref in cases:
        assert got.dtype == torch.bfloat16
        # float32 sums of float32 products sit within a few float32 ulps of the double result: one
        # rounding to bf16 agrees with the double's rounding but where that lies on a boundary
        assert (got.float() - ref.bfloat16().float()).ne(0).float().mean().item() < 0.03


def test_depthwise_bf16_operands_round_once(cache):
    """bf16 x and w (the bf16 policy's operands): float32 sums, one round to nearest even into the
    bf16 output, compiled and interpreted alike (a truncating store differs in about half the
    outputs)."""
    g = _gen(13)
    C = 8
    x32 = _rand(2, C, 16, 24, g=g)
    x, w = x32.bfloat16(), _rand(C, 1, 3, 3, g=g).bfloat16()
    mod = _load(render_depthwise(), "dw_plain", cache)
    # tiles holding every channel: few programs (the interpreter's cost is per program), the same sums
    y = mod.launch(x, w, padding=1, BLOCK_M=128, BLOCK_N=C)
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), padding=1, groups=C).bfloat16()
    assert y.dtype == torch.bfloat16
    assert (y.float().cpu() - ref.float()).ne(0).float().mean().item() < 0.02
    # the float32 input rounded in the kernel (the bf16 policy's absorbed cast): the same numbers
    y2 = mod.launch(x32, w, padding=1, out_dtype=torch.bfloat16, ROUND_X=True, BLOCK_M=128, BLOCK_N=C)
    assert torch.equal(y2, y)
    # the row-streaming kernel sums the taps in another order: within one bf16 step of it
    y3 = mod.launch(x32, w, padding=1, out_dtype=torch.bfloat16, ROUND_X=True, BLOCK_M=32, BLOCK_N=C, ROWS=4)
    assert (y3.float().cpu() - ref.float()).ne(0).float().mean().item() < 0.02


# ----------------------------------------------------------------------------- text and spaces

def test_rendered_text_and_loader(cache, tmp_path):
    ep = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "scalar")), "acc = acc * e1 + e0")
    for text in (render_gemm(ep), render_gemm(ep, batched=True), render_gemm_rowreduce(ep),
                 render_conv2d(ep), render_depthwise(ep)):
        assert "{{" not in text and "{%" not in text
        assert "def launch(" in text and "@triton.jit" in text
        assert "acc = acc * e1 + e0" in text
    text = render_gemm(ep, name="my_gemm")
    m1 = load_module_from_source(text, "my_gemm", tmp_path)
    m2 = load_module_from_source(text, "my_gemm", tmp_path)
    assert m1 is m2 and len(list(tmp_path.glob("my_gemm_*.py"))) == 1
    loads = render_operand_loads(ep, "rm", "rn", "msk", indent="")
    assert "tl.load(e0_ptr + rn, mask=rn < N" in loads and "tl.load(e1_ptr)" in loads
    with pytest.raises(ValueError):
        EpilogueOperand("e0", "diag")
    with pytest.raises(ValueError):
        EpilogueOperand("acc", "col")


def test_config_spaces():
    for prec in ("fp32", "tf32", "bf16"):
        sp = gemm_space(prec)
        assert 5 <= len(sp) <= 60
        assert len({tuple(sorted(c.items())) for c in sp}) == len(sp)
        for c in sp:
            assert set(c) == set(CONFIG_KEYS)
            eb = 2 if prec == "bf16" else 4
            assert c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * eb <= 227 * 1024
            assert c["BLOCK_M"] * c["BLOCK_N"] / (32 * c["num_warps"]) <= 128
    big = gemm_space("bf16", M=8192, N=8192, K=8192)
    assert big[0]["BLOCK_M"] * big[0]["BLOCK_N"] >= 128 * 128 and all(c["SPLIT_K"] == 1 for c in big)
    skinny = gemm_space("tf32", M=64, N=64, K=16384)
    assert any(c["SPLIT_K"] > 1 for c in skinny) and all(c["BLOCK_M"] <= 64 for c in skinny)
    tiny = gemm_space("fp32", M=8, N=8, K=8)
    assert tiny and all(c["BLOCK_M"] == 16 for c in tiny)
    # K-major operands: each tile with TMA loads first; row-major ones: copied K-major first;
    # where the tile count is at least twice the SMs, a persistent kernel follows
    plain = gemm_space("tf32", M=4096, N=4096, K=4096, max_configs=12)
    tma = gemm_space("tf32", M=4096, N=4096, K=4096, max_configs=12, tma=True)
    copy = gemm_space("tf32", M=4096, N=4096, K=4096, max_configs=12, kmajor_copy=True)
    for space, first in ((tma, dict(TMA=True)), (copy, dict(TMA=True, KMAJOR=True))):
        assert space[1::3] == plain[:4] and space[0::3] == [dict(c, **first) for c in plain[:4]]
        assert space[2::3] == [dict(c, **first, PERSISTENT=True) for c in plain[:4]]
        assert not any(c.get("WARP_SPECIALIZE") for c in space)
    few = gemm_space("tf32", M=1024, N=512, K=4096, max_configs=10)  # 32 tiles of 128 x 128: 1 per SM at most
    assert gemm_space("tf32", M=1024, N=512, K=4096, max_configs=20, tma=True)[1::2] == few
    assert not any(c.get("PERSISTENT") for c in gemm_space("tf32", M=1024, N=512, K=4096, tma=True))
    cs = conv_space("tf32", batch=32, Cin=256, Cout=256, OH=56, OW=56)
    assert 5 <= len(cs) <= 60 and all(c["SPLIT_K"] == 1 for c in cs)
    assert all(c["BLOCK_K"] <= 16 for c in conv_space("tf32", Cin=3, Cout=64))
    rr = rowreduce_space("tf32", M=512, N=100, K=64, reduce="softmax")
    assert rr and all(c["BLOCK_N"] == 128 for c in rr)
    # one program per BLOCK_M rows: M = 8192 fills 132 SMs with 64-row programs (128 programs),
    # not with 128-row ones (64 programs), so those come first
    full = rowreduce_space("bf16", M=8192, N=4096, K=4096, elem_bytes=2, spec=H200)
    assert full[0]["BLOCK_M"] == 64 and {c["BLOCK_M"] for c in full} > {64}
    # whole rows: <= 128 accumulator values a thread; seeds of distinct BLOCK_M x num_warps, the
    # fourth the first tile with TMA loads when the operands are K-major; every tile both ways
    whole = rowreduce_space("tf32", M=32768, N=256, K=1024, reduce="tile", max_configs=200)
    assert all(c["BLOCK_N"] == 256 and c["BLOCK_M"] * 256 <= 128 * 32 * c["num_warps"] for c in whole)
    assert len({(c["BLOCK_M"], c["num_warps"]) for c in whole[:4]}) == 4 and not any(c.get("TMA") for c in whole)
    tma = rowreduce_space("tf32", M=32768, N=256, K=1024, reduce="tile", max_configs=200, tma=True)
    assert tma[:3] == whole[:3] and tma[3] == dict(whole[0], TMA=True)
    assert sorted(map(str, tma)) == sorted(map(str, whole + [dict(c, TMA=True) for c in whole]))
    dw = depthwise_space(C=64, OW=56, max_configs=500)
    assert 3 <= len(depthwise_space(C=64)) <= 30
    assert all(c["BLOCK_W"] in (32, 64) and c["BLOCK_W"] <= c["BLOCK_M"] for c in dw)
    assert {c["BLOCK_W"] for c in dw if c["BLOCK_M"] >= 64} == {32, 64}  # whole rows and 32-wide
    assert len({tuple(sorted(c.items())) for c in dw}) == len(dw)


# on a GPU also a shape with several tiles per SM (132 programs walk 33 x 16 tiles of 64 x 64)
_PERSISTENT_CASES = [((40, 24, 48), TILE)] + ([((2100, 1000, 512), dict(TILE, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))]
                                              if DEVICE == "cuda" else [])


@pytest.mark.parametrize("shape,tile", _PERSISTENT_CASES)
@pytest.mark.parametrize("warp_specialize", [False, True])
def test_persistent_path(cache, warp_specialize, shape, tile):
    """PERSISTENT=True: a few programs (4 in the interpreter) walk all output tiles (here 3 x 2
    of them, edges included) with TMA loads and the epilogue in registers; bf16 cast in-kernel;
    invalid combinations are refused before any launch."""
    g = _gen(10)
    M, N, K = shape
    a, w, bias = _rand(M, K, g=g), _rand(N, K, g=g), _rand(N, g=g)
    fused = _load(render_gemm(Epilogue((EpilogueOperand("bias", "col"),), "acc = tl.maximum(acc + bias, 0.0)")),
                  "gemm_persistent", cache)
    cfg = dict(tile, TMA=True, PERSISTENT=True, WARP_SPECIALIZE=warp_specialize)
    _close(fused.launch(a, w.t(), bias, **cfg), torch.relu(a @ w.t() + bias))
    ref = torch.relu(a.bfloat16().float() @ w.t().bfloat16().float() + bias)
    _close(fused.launch(a, w.bfloat16().t(), bias, **cfg, **precision_kwargs("bf16")), ref, tol=1e-3)
    with pytest.raises(ValueError, match="PERSISTENT needs TMA"):
        fused.launch(a, w.t(), bias, **dict(cfg, TMA=False))
    with pytest.raises(ValueError, match="PERSISTENT needs TMA"):
        fused.launch(a, w.t(), bias, **dict(cfg, SPLIT_K=2))


@pytest.mark.parametrize("M,N,K,split_k", [(40, 24, 64, 1), (33, 17, 40, 2)])
def test_tma_path(cache, M, N, K, split_k):
    """TMA=True loads tiles through tensor descriptors of A and B^T (the copy engine pads past
    the edges with zeros): same result as the pointer path, with the epilogue, split-K and the
    in-kernel bf16 cast; operands that are not K-major are refused with a clear error."""
    g = _gen(9)
    a, w, bias = _rand(M, K, g=g), _rand(N, K, g=g), _rand(N, g=g)
    fused = _load(render_gemm(Epilogue((EpilogueOperand("bias", "col"),), "acc = tl.maximum(acc + bias, 0.0)")),
                  "gemm_tma", cache)
    cfg = dict(TILE, SPLIT_K=split_k, TMA=True)
    _close(fused.launch(a, w.t(), bias, **cfg), torch.relu(a @ w.t() + bias))
    ref = a.bfloat16().float() @ w.t().bfloat16().float()
    plain = _load(render_gemm(IDENTITY), "gemm_plain_tma", cache)
    _close(plain.launch(a, w.bfloat16().t(), **cfg, **precision_kwargs("bf16")), ref, tol=1e-3)
    with pytest.raises(ValueError, match="K-major"):
        plain.launch(a, w.t().contiguous(), **cfg)  # B row-major: B^T is not K-major
    # ... unless KMAJOR copies it K-major first (the tf32 search offers that for row-major B)
    _close(plain.launch(a, w.t().contiguous(), **cfg, KMAJOR=True), a @ w.t())
