"""Error measure of docs/design.md's verification protocol: the excess over allclose.

    excess = max over elements of (|out - ref| - tol * |ref|)      (computed in float64)

A candidate is allclose with rtol = atol = tol exactly when its excess is at most tol. The excess
may be negative (every element well inside the tolerance). Where the reference is not finite the
output must match it exactly (NaN where NaN, the same infinity); a non-finite output where the
reference is finite, a shape mismatch, or a dtype mismatch gives an excess of +inf with a reason.
"""
from __future__ import annotations

import math

import torch

from kernelwright.capture.shapes import dense_permuted

__all__ = ["excess", "excess_reason", "park", "poisoned_like", "rounded_reference"]

CHUNK = 1 << 24  # elements compared at a time (float64 temporaries of ~128 MiB each)
PARK_BYTES = 1 << 30  # references smaller than this always stay where they are
# a reference at least PARK_BYTES large stays on the GPU while it takes at most this share of the
# GPU's free memory: moving one to host memory and back in chunks costs seconds per gigabyte
# (pageable copies), which the verification of a large convolution's 1.6 GiB float64 output paid
# 15 times in one optimize, 25 of its 72 seconds (cProfile on the H200, docs/benchmarks.md "The
# restructured pipeline against the tree before it")
PARK_SHARE = 1 / 8


def park(t):
    """`t` as a reference to compare against later. A GPU tensor of at least PARK_BYTES that takes
    more than PARK_SHARE of the GPU's free memory is, if float64, first rounded to float32
    (`rounded_reference`: half the bytes, and often then small enough to stay), and if still too
    large moves to host memory (comparisons bring it back one chunk at a time), so a large float64
    reference does not crowd out the candidate's inputs and outputs. Anything else is returned as
    is."""
    if not (isinstance(t, torch.Tensor) and t.device.type == "cuda"):
        return t
    size = t.numel() * t.element_size()
    if size < PARK_BYTES:
        return t
    free = torch.cuda.mem_get_info(t.device)[0]
    if not parks(size, free):
        return t
    if t.dtype == torch.float64 and free > 1.25 * t.numel() * 4:
        narrow = rounded_reference(t)
        if narrow is not None:
            t = narrow
            if not parks(t.numel() * 4, torch.cuda.mem_get_info(t.device)[0] + size):
                return t  # (the caller lets the float64 one go)
    return t.detach().to("cpu")


def rounded_reference(t: torch.Tensor) -> torch.Tensor | None:
    """A float64 reference rounded to float32 in t's memory order, or None where a finite value
    overflows float32 or t is not dense (in some order of its dims). Rounding moves each value by
    at most 2^-24 of its magnitude (6e-8), which changes an excess (max |out - ref| - tol |ref|) by
    at most 6e-8 |ref|: below the tightest policy tolerance (fp32's 1e-4) by three orders of
    magnitude, and below the float32 eager run's own error. NaN and infinities are kept. Converted
    in CHUNK pieces (temporaries of a bounded size)."""
    if not dense_permuted(tuple(t.shape), tuple(t.stride())):
        return None
    out = torch.empty_like(t, dtype=torch.float32)  # (a dense tensor's strides are kept)
    n = t.numel()
    src = t.detach().as_strided((n,), (1,), t.storage_offset())  # (both dense in one order: memory order)
    dst = out.as_strided((n,), (1,), out.storage_offset())
    for start in range(0, n, CHUNK):
        piece, narrow = src[start:start + CHUNK], dst[start:start + CHUNK]
        narrow.copy_(piece)
        if bool((torch.isinf(narrow) & torch.isfinite(piece)).any()):
            return None
    return out


def parks(size: int, free: int) -> bool:
    """Whether a GPU reference of `size` bytes waits in host memory when the GPU has `free` bytes."""
    return size >= PARK_BYTES and size > PARK_SHARE * free


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    if dtype == torch.bool:
        return "bool"
    return "int"


REFERENCE_NOT_FINITE = "where the reference is not finite differ"  # (a NaN/Inf mismatch's reason says it)


def excess_reason(
    out: torch.Tensor, ref: torch.Tensor, tol: float, dtype: torch.dtype | None = None
) -> tuple[float, str | None]:
    """(excess, reason): reason is None unless the excess is +inf (then it says why).

    `dtype` is the dtype `out` must have (e.g. the eager float32 output's dtype while `ref` is the
    float64 reference); without it only the kind (float, complex, int, bool) must match `ref`'s.
    """
    if not isinstance(out, torch.Tensor):
        return math.inf, f"output is a {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf, f"shape mismatch: got {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if dtype is not None and out.dtype != dtype:
        return math.inf, f"dtype mismatch: got {out.dtype}, expected {dtype}"
    if dtype is None and _kind(out.dtype) != _kind(ref.dtype):
        return math.inf, f"dtype mismatch: got {out.dtype}, expected a {_kind(ref.dtype)} dtype like {ref.dtype}"
    if out.numel() == 0:
        return -math.inf, None
    wide = torch.complex128 if out.dtype.is_complex or ref.dtype.is_complex else torch.float64
    o_all = out.detach().as_subclass(torch.Tensor).reshape(-1)
    r_all = ref.detach().as_subclass(torch.Tensor).reshape(-1)
    value, ref_mismatch, out_mismatch, any_finite = -math.inf, 0, 0, False
    # on the output's GPU when there is one (a parked reference comes back chunk by chunk)
    where = out.device if out.device.type != "cpu" else ref.device
    for start in range(0, o_all.numel(), CHUNK):  # in pieces: float64 temporaries of a bounded size
        o = o_all[start:start + CHUNK].to(device=where, dtype=wide)
        r = r_all[start:start + CHUNK].to(device=where, dtype=wide)
        if wide == torch.complex128:
            o, r = torch.view_as_real(o), torch.view_as_real(r)
        r_fin = torch.isfinite(r)
        if not bool(r_fin.all()):
            bad = ~r_fin
            # NaN must meet NaN; an infinity must meet the same infinity.
            same = torch.where(torch.isnan(r), torch.isnan(o), o == r)
            ref_mismatch += int((~same & bad).sum())
        out_mismatch += int((~torch.isfinite(o) & r_fin).sum())
        if bool(r_fin.any()):
            any_finite = True
            o, r = o[r_fin], r[r_fin]
            value = max(value, float(((o - r).abs() - tol * r.abs()).max()))
    if ref_mismatch:
        return math.inf, f"NaN/Inf mismatch: {ref_mismatch} element(s) {REFERENCE_NOT_FINITE}"
    if out_mismatch:
        return math.inf, f"NaN/Inf mismatch: {out_mismatch} non-finite element(s) where the reference is finite"
    return (value if any_finite else -math.inf), None


def excess(out: torch.Tensor, ref: torch.Tensor, tol: float, dtype: torch.dtype | None = None) -> float:
    """max(|out - ref| - tol*|ref|) in float64; +inf on NaN/Inf, shape or dtype mismatch."""
    return excess_reason(out, ref, tol, dtype)[0]


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor like `t` (shape, dtype, strides, device) filled with poison: NaN for floating and
    complex dtypes, the dtype's largest value for integers, True for bool. Launchers give kernels
    such buffers in verification mode so that elements a kernel never writes fail the comparison."""
    # (empty_strided keeps any strides, a concatenation's slice's too, where *_like makes a
    # non-dense tensor contiguous)
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return out.fill_(float("nan"))
    return out.fill_(True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
