"""Copies into a concatenation's buffer (plan.concat): a value that no kernel wrote in its slice
is copied there as the forward runs. Shipped as kernels/_copy.py beside an emitted module whose
forward makes such copies (emit/module.py), and called by the tuner to charge a unit for the
copy its output needs (search/units.py).

A value and its slice often differ in layout: a channels-last convolution's output goes into a
slice of a contiguous (NCHW) buffer. torch's `copy_` moves such a transpose with a strided
elementwise kernel at about a third of the memory bandwidth; `_nsc_copy_kernel` moves it in
tiles, each loaded along the source's contiguous axis and stored along the destination's, with
Triton exchanging the tile through shared memory (a tiled transpose).
"""
import os

import triton
import triton.language as tl

try:
    from ._host import _cdiv, _launch  # kernels/_host.py beside this file
except ImportError:  # imported as kernelwright.codegen.slice_copy
    from kernelwright.codegen.host import _cdiv, _launch


@triton.jit
def _nsc_copy_kernel(
    x_ptr,  # source, seen as [N, C, S] with strides (xn, xc, xs)
    y_ptr,  # destination of the same [N, C, S] with strides (yn, yc, ys)
    C, S,  # channels; positions (the spatial dims merged)
    xn, xc, xs, yn, yc, ys,  # element strides (integers equal to 1 are specialised by Triton: vector access)
    BLOCK_C: tl.constexpr,  # channels per tile
    BLOCK_S: tl.constexpr,  # positions per tile
):
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)[None, :]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]
    n = tl.program_id(2).to(tl.int64)
    mask = (c < C) & (s < S)
    v = tl.load(x_ptr + n * xn + c * xc + s * xs, mask=mask)
    tl.store(y_ptr + n * yn + c * yc + s * ys, v, mask=mask)


def _nsc(t):
    """(N, C, S) and the (n, c, s) strides of a 3-D to 5-D tensor whose spatial dims merge into
    one run of positions; None where they do not."""
    if t.dim() < 3 or t.dim() > 5:
        return None
    spatial = [(n, st) for n, st in zip(t.shape[2:], t.stride()[2:]) if n != 1]  # (a size-1 dim's stride is free)
    if not spatial or any(outer != n * inner for (_, outer), (n, inner) in zip(spatial, spatial[1:])):
        return None
    s = 1
    for n, _ in spatial:
        s *= n
    return (t.shape[0], t.shape[1], s), (t.stride(0), t.stride(1), spatial[-1][1])


# Fewer elements than this go through copy_: the tiled path's Python (about 20 us a call) costs
# more than it saves. Measured on an H100 at `42a8bf3` (docs/benchmarks.md, "KernelBench level-3
# CNNs in eval mode; copies into a concatenation's slice"): 0.5 M float32 elements, copy_ 8.8 us
# against 27.9 tiled; 16 M elements, 138 us against 48.
MIN_TILED = 1 << 21


def _tiled(dst, src) -> tuple | None:
    """The tiled kernel's (N, C, S) and both tensors' (n, c, s) strides when copying `src` into
    `dst` transposes channels and positions (one of the two is contiguous along the channels, the
    other along the positions) between two tensors that share no memory, on a device the kernel
    runs on (a GPU, or Triton's interpreter), within 32-bit offsets per image; on a GPU, of at
    least MIN_TILED elements. Else None."""
    if src.dtype != dst.dtype or src.shape != dst.shape or src.numel() == 0 or src.device != dst.device:
        return None
    if src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
        return None  # one buffer's two slices (a value joined twice): copy_, which checks for overlap
    if not (src.is_cuda and src.numel() >= MIN_TILED or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    a, b = _nsc(src), _nsc(dst)
    if a is None or b is None:
        return None
    (_, C, S), (_, xc, xs), (_, yc, ys) = a[0], a[1], b[1]
    if C < 2 or S < 2 or not ((xc == 1 and ys == 1) or (xs == 1 and yc == 1)):
        return None
    if max(abs(xc) * C + abs(xs) * S, abs(yc) * C + abs(ys) * S) >= 2 ** 31:
        return None
    return a[0] + a[1] + b[1]


def copy_into(dst, src):
    """`dst.copy_(src)`; a channels/positions transpose as tiles of 32 channels x 64 positions."""
    tiled = _tiled(dst, src)
    if tiled is None:
        dst.copy_(src)
        return
    N, C, S, *strides = tiled
    grid = (_cdiv(S, 64), _cdiv(C, 32), N)
    _launch(_nsc_copy_kernel, grid, src, dst, C, S, *strides, BLOCK_C=32, BLOCK_S=64, num_warps=4, num_stages=1)


def into(buffer, dim, start, t):
    """`t` in its slice of a concatenation's buffer (the slice itself where a kernel wrote it there,
    else copied into it): later reads and the concatenation see the buffer."""
    s = buffer.narrow(dim, start, t.shape[dim])
    if s.data_ptr() != t.data_ptr() or s.stride() != t.stride():
        copy_into(s, t)
    return s
