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

# kw_* names in the expressions are device helpers (templates/triton/device_helpers.py), defined in
# the kernel modules that use them (codegen/helpers.py)
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


def _fn(name: str, n: int = 1) -> Expr:
    """`name` applied to the first `n` operands."""
    return lambda a, kw: f"{name}({', '.join(a[:n])})"


def _op(symbol: str) -> Expr:
    """The binary operator `symbol` between the two operands, parenthesised."""
    return lambda a, kw: f"({a[0]} {symbol} {a[1]})"


POINTWISE: dict[str, Expr] = {
    "aten._to_copy.default": _to_float,
    "aten.add.Tensor": lambda a, kw: _alpha(a, kw, "+"),
    "aten.add.Scalar": lambda a, kw: _alpha(a, kw, "+"),
    "aten.sub.Tensor": lambda a, kw: _alpha(a, kw, "-"),
    "aten.sub.Scalar": lambda a, kw: _alpha(a, kw, "-"),
    "aten.rsub.Scalar": lambda a, kw: f"({a[1]} - {a[0]})",
    **{f"aten.{name}.{kind}": _op(symbol) for name, symbol in (("mul", "*"), ("div", "/"))
       for kind in ("Tensor", "Scalar")},
    "aten.neg.default": lambda a, kw: f"(-{a[0]})",
    "aten.reciprocal.default": lambda a, kw: f"(1.0 / {a[0]})",
    "aten.relu.default": lambda a, kw: f"tl.maximum({a[0]}, 0.0)",
    "aten.leaky_relu.default": lambda a, kw: f"tl.where({a[0]} > 0.0, {a[0]}, {a[0]} * {_f(kw.get('negative_slope', 0.01))})",
    "aten.gelu.default": _gelu,
    # Triton's own functions, and device helpers (kw_*) where Triton's lose accuracy or have none
    **{f"aten.{name}.default": _fn(f"tl.{name}") for name in ("sigmoid", "exp", "exp2", "log", "log2", "sqrt",
                                                              "rsqrt", "abs", "sin", "cos", "erf", "floor", "ceil")},
    **{f"aten.{name}.default": _fn(f"kw_{name}") for name in ("tanh", "expm1", "log1p", "mish")},
    "aten.sign.default": lambda a, kw: f"tl.where({a[0]} > 0.0, 1.0, tl.where({a[0]} < 0.0, -1.0, 0.0))",
    "aten.pow.Tensor_Scalar": _pow,
    "aten.pow.Tensor_Tensor": _fn("kw_pow", 2),
    "aten.maximum.default": _fn("tl.maximum", 2),
    "aten.minimum.default": _fn("tl.minimum", 2),
    "aten.clamp.default": lambda a, kw: _clamp(a[0], _opt(kw.get("min_s")), _opt(kw.get("max_s"))),
    "aten.clamp_min.default": _fn("tl.maximum", 2),
    "aten.clamp_max.default": _fn("tl.minimum", 2),
    "aten.hardtanh.default": lambda a, kw: _clamp(a[0], _f(kw.get("min_val", -1.0)), _f(kw.get("max_val", 1.0))),
    "aten.elu.default": lambda a, kw: (
        f"tl.where({a[0]} > 0.0, {a[0]} * {_f(kw.get('scale', 1.0))}, "
        f"kw_expm1({a[0]} * {_f(kw.get('input_scale', 1.0))}) * {_f(kw.get('alpha', 1.0) * kw.get('scale', 1.0))})"
    ),
    **{f"aten.where.{kind}": _fn("tl.where", 3) for kind in ("self", "ScalarSelf", "ScalarOther")},
    "aten.isnan.default": lambda a, kw: f"({a[0]} != {a[0]})",
    "aten.isinf.default": lambda a, kw: f"(tl.abs({a[0]}) == float('inf'))",
    **{f"aten.{name}.{kind}": _op(symbol) for name, symbol in (("gt", ">"), ("lt", "<"), ("ge", ">="), ("le", "<="),
                                                               ("eq", "=="), ("ne", "!="))
       for kind in ("Scalar", "Tensor")},
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
