"""The Triton device helpers of generated kernels (templates/triton/*.j2 and the op table,
codegen/triton_ops.py), with the imports they need. A rendered kernel module carries the
definitions it references and what they reference in turn, in this file's order
(codegen/helpers.py `with_helpers`)."""
import os

import triton
import triton.language as tl


# Triton 3.6's interpreter (TRITON_INTERPRET=1: the CPU tests) truncates float32 -> bf16 casts and
# flushes bf16 subnormals to zero, where torch and the GPU round to the nearest even; there
# kw_round_bf16 rounds with integer arithmetic instead. Compiled kernels take the cast.
KW_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def kw_round_bf16(x):
    # float32 x rounded to the nearest bfloat16 (ties to even), returned as float32; NaN stays NaN
    if KW_INTERPRETED:
        u = x.to(tl.uint32, bitcast=True)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(x != x, x, r)
    else:
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)


@triton.jit
def kw_cast_to(x, dtype: tl.constexpr):
    # x converted to `dtype`; in the interpreter a float32 -> bf16 conversion rounds to nearest even
    # (kw_round_bf16) as the compiled cast does
    if KW_INTERPRETED:
        if dtype == tl.bfloat16:
            if x.dtype == tl.float32:
                x = kw_round_bf16(x)
    return x.to(dtype)


@triton.jit
def kw_cast_out(x, ptr):
    # x converted to the element type of `ptr` for a store
    return kw_cast_to(x, ptr.dtype.element_ty)


@triton.jit
def kw_tanh(x):
    # tanh through exp2, stable for large |x|
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def kw_mish(x):
    # x * tanh(softplus(x)) as x * n / (n + 2) with n = t (t + 2), t = e^x: tanh(log(1 + t)) is
    # ((1 + t)^2 - 1) / ((1 + t)^2 + 1). One exponential and one division where the composition
    # takes three transcendentals and two divisions, and no cancellation: n > 0. Above softplus's
    # threshold (20) the result is x, as ATen's; the clamp keeps n finite in the branch not taken.
    t = tl.exp(tl.minimum(x, 20.0))
    n = t * (t + 2.0)
    return tl.where(x > 20.0, x, x * (n / (n + 2.0)))


@triton.jit
def kw_gelu_erf(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def kw_gelu_tanh(x):
    return 0.5 * x * (1.0 + kw_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def kw_expm1(x):
    # exp(x) - 1 with a Taylor branch near zero to keep relative accuracy
    small = tl.abs(x) < 1e-3
    return tl.where(small, x + 0.5 * x * x + x * x * x / 6.0, tl.exp(x) - 1.0)


@triton.jit
def kw_log1p(x):
    # log(1 + x) accurate near zero: u = 1 + x, correct the rounding of u
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def kw_pow(x, y):
    # x ** y for a tensor exponent (NaN for negative x, like a real power)
    return tl.exp2(y * tl.log2(x))


# Triton 3.6's interpreter (TRITON_INTERPRET=1, CPU tests) returns garbage for tl.dot on bfloat16
# operands and truncates float32 -> bf16 casts; there the tiles are rounded to bf16 values with
# integer arithmetic (kw_round_bf16) and multiplied in an exact ("ieee") float32 dot, which computes
# the same products. Compiled kernels never take this path.
_DOT_F32 = KW_INTERPRETED.value


@triton.jit
def kw_dot_operand(x, dtype: tl.constexpr):
    # x as a tl.dot operand in `dtype` (a float32 tile rounded to nearest even); in the interpreter
    # a bf16 operand is held in float32 instead (its bf16 dot is wrong there, see _DOT_F32)
    if KW_INTERPRETED and dtype == tl.bfloat16:
        if x.dtype == tl.float32:
            x = kw_round_bf16(x)
        x = x.to(tl.float32)
    elif x.dtype == tl.float32 and dtype != tl.float32:
        x = x.to(dtype, fp_downcast_rounding="rtne")
    else:
        x = x.to(dtype)
    return x


@triton.jit
def _dot_operands(a, b, CAST_A: tl.constexpr, CAST_B: tl.constexpr, DOT_F32: tl.constexpr):
    # the tiles as the dot takes them: float32 tiles rounded to bf16 (to nearest even, as a cast
    # kernel would) where CAST_A / CAST_B say so; in the interpreter, bf16 values held in float32
    if DOT_F32:  # interpreter only (see _DOT_F32); bf16 x bf16 products are exact in float32
        if CAST_A:
            a = kw_round_bf16(a)
        if CAST_B:
            b = kw_round_bf16(b)
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    else:
        if CAST_A:
            a = a.to(tl.bfloat16, fp_downcast_rounding="rtne")
        if CAST_B:
            b = b.to(tl.bfloat16, fp_downcast_rounding="rtne")
    return a, b
