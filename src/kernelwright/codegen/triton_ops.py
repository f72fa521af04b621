"""The Triton op table: ATen elementwise ops as Triton expressions (fp32 in registers).

Each entry takes the rendered operand expressions (`a`: list of str; tensors and Python scalars
already rendered) plus the node's remaining arguments, and returns one Triton expression.
`POINTWISE` has an entry for exactly the targets of `kernelwright.ops.POINTWISE`, the elementwise
ops the planner fuses (checked at import).
"""
from __future__ import annotations

import math
from typing import Callable

from kernelwright.ops import POINTWISE as FUSIBLE

# helpers defined in the rendered kernel file's prelude (see templates/triton/prelude.py.j2)
Expr = Callable[[list, dict], str]


def _f(v) -> str:
    """A Python number as a Triton literal."""
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    v = float(v)
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    if math.isnan(v):
        return "float('nan')"
    return repr(v)


def _alpha(a, kw, op):
    alpha = kw.get("alpha", 1)
    rhs = a[1] if alpha == 1 else f"({a[1]} * {_f(alpha)})"
    return f"({a[0]} {op} {rhs})"


def _clamp(x, lo, hi):
    out = x
    if lo is not None:
        out = f"tl.maximum({out}, {lo})"
    if hi is not None:
        out = f"tl.minimum({out}, {hi})"
    return out


def _opt(v):
    return None if v is None else _f(v)


def _gelu(a, kw):
    if kw.get("approximate", "none") == "tanh":
        return f"kw_gelu_tanh({a[0]})"
    return f"kw_gelu_erf({a[0]})"


def _pow(a, kw):
    e = kw["exponent"]
    x = a[0]
    if isinstance(e, str):  # tensor exponent
        return f"kw_pow({x}, {e})"
    e = float(e)
    if e == 0.5:
        return f"tl.sqrt({x})"
    if e == -0.5:
        return f"tl.rsqrt({x})"
    if e.is_integer() and abs(e) <= 4:
        n = int(abs(e))
        prod = "1.0" if n == 0 else " * ".join([x] * n)
        return f"({prod})" if e >= 0 else f"(1.0 / ({prod}))"
    mag = f"tl.exp2({_f(e)} * tl.log2(tl.abs({x})))"
    if e.is_integer():
        return f"tl.where({x} < 0.0, {'-' if int(e) % 2 else ''}{mag}, {mag})"
    return f"tl.exp2({_f(e)} * tl.log2({x}))"


def _to_float(a, kw) -> str:
    """A cast between float dtypes, computed in float32: narrowing rounds to the nearest even,
    like torch (bf16 through helpers' kw_round_bf16, which also does so in Triton's interpreter),
    widening is exact. The planner only fuses float-to-float casts (see fusion)."""
    target = str(kw.get("dtype", "torch.float32")).replace("torch.", "")
    if target == "float32":
        return f"{a[0]}.to(tl.float32)"
    if target == "bfloat16":
        return f"kw_round_bf16({a[0]})"
    return f'{a[0]}.to(tl.{target}, fp_downcast_rounding="rtne").to(tl.float32)'


POINTWISE: dict[str, Expr] = {
    "aten._to_copy.default": _to_float,
    "aten.add.Tensor": lambda a, kw: _alpha(a, kw, "+"),
    "aten.add.Scalar": lambda a, kw: _alpha(a, kw, "+"),
    "aten.sub.Tensor": lambda a, kw: _alpha(a, kw, "-"),
    "aten.sub.Scalar": lambda a, kw: _alpha(a, kw, "-"),
    "aten.rsub.Scalar": lambda a, kw: f"({a[1]} - {a[0]})",
    "aten.mul.Tensor": lambda a, kw: f"({a[0]} * {a[1]})",
    "aten.mul.Scalar": lambda a, kw: f"({a[0]} * {a[1]})",
    "aten.div.Tensor": lambda a, kw: f"({a[0]} / {a[1]})",
    "aten.div.Scalar": lambda a, kw: f"({a[0]} / {a[1]})",
    "aten.neg.default": lambda a, kw: f"(-{a[0]})",
    "aten.reciprocal.default": lambda a, kw: f"(1.0 / {a[0]})",
    "aten.relu.default": lambda a, kw: f"tl.maximum({a[0]}, 0.0)",
    "aten.leaky_relu.default": lambda a, kw: f"tl.where({a[0]} > 0.0, {a[0]}, {a[0]} * {_f(kw.get('negative_slope', 0.01))})",
    "aten.gelu.default": _gelu,
    "aten.sigmoid.default": lambda a, kw: f"tl.sigmoid({a[0]})",
    "aten.tanh.default": lambda a, kw: f"kw_tanh({a[0]})",
    "aten.exp.default": lambda a, kw: f"tl.exp({a[0]})",
    "aten.exp2.default": lambda a, kw: f"tl.exp2({a[0]})",
    "aten.expm1.default": lambda a, kw: f"kw_expm1({a[0]})",
    "aten.log.default": lambda a, kw: f"tl.log({a[0]})",
    "aten.log2.default": lambda a, kw: f"tl.log2({a[0]})",
    "aten.log1p.default": lambda a, kw: f"kw_log1p({a[0]})",
    "aten.sqrt.default": lambda a, kw: f"tl.sqrt({a[0]})",
    "aten.rsqrt.default": lambda a, kw: f"tl.rsqrt({a[0]})",
    "aten.abs.default": lambda a, kw: f"tl.abs({a[0]})",
    "aten.sign.default": lambda a, kw: f"tl.where({a[0]} > 0.0, 1.0, tl.where({a[0]} < 0.0, -1.0, 0.0))",
    "aten.sin.default": lambda a, kw: f"tl.sin({a[0]})",
    "aten.cos.default": lambda a, kw: f"tl.cos({a[0]})",
    "aten.erf.default": lambda a, kw: f"tl.erf({a[0]})",
    "aten.floor.default": lambda a, kw: f"tl.floor({a[0]})",
    "aten.ceil.default": lambda a, kw: f"tl.ceil({a[0]})",
    "aten.pow.Tensor_Scalar": _pow,
    "aten.pow.Tensor_Tensor": lambda a, kw: f"kw_pow({a[0]}, {a[1]})",
    "aten.maximum.default": lambda a, kw: f"tl.maximum({a[0]}, {a[1]})",
    "aten.minimum.default": lambda a, kw: f"tl.minimum({a[0]}, {a[1]})",
    "aten.clamp.default": lambda a, kw: _clamp(a[0], _opt(kw.get("min_s")), _opt(kw.get("max_s"))),
    "aten.clamp_min.default": lambda a, kw: f"tl.maximum({a[0]}, {a[1]})",
    "aten.clamp_max.default": lambda a, kw: f"tl.minimum({a[0]}, {a[1]})",
    "aten.hardtanh.default": lambda a, kw: _clamp(a[0], _f(kw.get("min_val", -1.0)), _f(kw.get("max_val", 1.0))),
    "aten.elu.default": lambda a, kw: (
        f"tl.where({a[0]} > 0.0, {a[0]} * {_f(kw.get('scale', 1.0))}, "
        f"kw_expm1({a[0]} * {_f(kw.get('input_scale', 1.0))}) * {_f(kw.get('alpha', 1.0) * kw.get('scale', 1.0))})"
    ),
    "aten.where.self": lambda a, kw: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "aten.where.ScalarSelf": lambda a, kw: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "aten.where.ScalarOther": lambda a, kw: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "aten.isnan.default": lambda a, kw: f"({a[0]} != {a[0]})",
    "aten.isinf.default": lambda a, kw: f"(tl.abs({a[0]}) == float('inf'))",
    "aten.gt.Scalar": lambda a, kw: f"({a[0]} > {a[1]})",
    "aten.gt.Tensor": lambda a, kw: f"({a[0]} > {a[1]})",
    "aten.lt.Scalar": lambda a, kw: f"({a[0]} < {a[1]})",
    "aten.lt.Tensor": lambda a, kw: f"({a[0]} < {a[1]})",
    "aten.ge.Scalar": lambda a, kw: f"({a[0]} >= {a[1]})",
    "aten.ge.Tensor": lambda a, kw: f"({a[0]} >= {a[1]})",
    "aten.le.Scalar": lambda a, kw: f"({a[0]} <= {a[1]})",
    "aten.le.Tensor": lambda a, kw: f"({a[0]} <= {a[1]})",
    "aten.eq.Scalar": lambda a, kw: f"({a[0]} == {a[1]})",
    "aten.eq.Tensor": lambda a, kw: f"({a[0]} == {a[1]})",
    "aten.ne.Scalar": lambda a, kw: f"({a[0]} != {a[1]})",
    "aten.ne.Tensor": lambda a, kw: f"({a[0]} != {a[1]})",
    "aten.logical_not.default": lambda a, kw: f"({a[0]} == 0)",
}
if set(POINTWISE) != FUSIBLE:
    raise ImportError(f"the Triton op table and kernelwright.ops.POINTWISE differ: only in the table "
                      f"{sorted(set(POINTWISE) - FUSIBLE)}, only in ops {sorted(FUSIBLE - set(POINTWISE))}")

# positional argument names after the tensor operands, per op (ATen schema order)
EXTRA_ARGS = {
    "aten.add.Tensor": ["alpha"],
    "aten.sub.Tensor": ["alpha"],
    "aten.leaky_relu.default": ["negative_slope"],
    "aten.gelu.default": [],
    "aten.pow.Tensor_Scalar": ["exponent"],
    "aten.clamp.default": ["min_s", "max_s"],
    "aten.hardtanh.default": ["min_val", "max_val"],
    "aten.elu.default": ["alpha", "scale", "input_scale"],
}

# number of leading operands that may be tensors (the rest are attributes)
OPERANDS = {
    "aten.leaky_relu.default": 1,
    "aten.pow.Tensor_Scalar": 1,
    "aten.clamp.default": 1,
    "aten.hardtanh.default": 1,
    "aten.elu.default": 1,
    "aten.gelu.default": 1,
}


format_float = _f
