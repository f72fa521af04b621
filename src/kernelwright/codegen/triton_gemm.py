"""Triton GEMM / convolution templates with fused epilogues.

Each ``render_*`` function returns the text of a self-contained Python module (torch + triton
only) holding the kernel(s) and a documented ``launch(...)`` function beside them
(``launch`` takes torch tensors, allocates and returns the output).  Variants (tile sizes,
precision, split-K, layout) are ``tl.constexpr`` launch arguments; the only rendered parts are
the epilogue statements and the epilogue operand parameters.  Load a rendered module with
:func:`kernelwright.build.pyload.load_module_from_source`.

Their schedule spaces are in :mod:`kernelwright.space.gemm_space`; pass one of its configs to
``launch(**config, **precision_kwargs(policy))``.
"""
from __future__ import annotations

import textwrap

from kernelwright.codegen.epilogue import (
    IDENTITY,
    Epilogue,
    operand_params,
    render_code,
    render_operand_loads,
)
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
# whole_row_block_n: gemm_epilogue.py sets the rendered BLOCK_N with it
from kernelwright.space.gemm_space import ROW_NORMALIZATIONS, ROW_REDUCE_MODES, WHOLE_ROW, whole_row_block_n

_KIND_DOC = {
    "col": "one value per output column n: N elements",
    "row": "one value per output row m: M elements",
    "full": "expandable to the output's shape; any strides, broadcast views need no copy",
    "scalar": "a 0-d tensor or a number",
}
_KIND_DOC_BATCHED = {
    "col": "N elements shared by all batches, or [B, N]",
    "row": "M elements shared by all batches, or [B, M]",
    "full": "expandable to [B, M, N]; any strides",
    "scalar": "a 0-d tensor or a number",
}
_CONV_KIND_DOC = {
    "col": "one value per output channel: Cout elements, e.g. a bias",
    "row": "one value per output pixel: N*OH*OW elements",
    "full": "expandable to the output's [N, Cout, OH, OW]; any strides",
    "scalar": "a 0-d tensor or a number",
}


# ----------------------------------------------------------------------------- rendering

def _check_name(name: str) -> None:
    if not name.isidentifier():
        raise ValueError(f"kernel name {name!r} is not a Python identifier")


def _common_context(epilogue: Epilogue, name: str) -> dict:
    _check_name(name)
    return dict(
        name=name,
        epilogue=epilogue,
        operand_spec=repr(tuple((o.name, o.kind) for o in epilogue.operands)),
        kinds=repr([o.kind for o in epilogue.operands]),
        names=", ".join(o.name for o in epilogue.operands),
        code_doc=render_code(epilogue, indent="    "),
        kind_doc=_KIND_DOC,
        conv_kind_doc=_CONV_KIND_DOC,
    )


def _gemm_context(epilogue: Epilogue, name: str, batched: bool) -> dict:
    """What the GEMM templates share: the epilogue's parameters, operand loads and code inside the
    tile loop (8 spaces deep), for a batched GEMM or not."""
    ctx = _common_context(epilogue, name)
    ctx.update(
        batched=bool(batched),
        params=operand_params(epilogue, batched=batched),
        loads=render_operand_loads(epilogue, "offs_m", "offs_n", "mask", batch="pid_b" if batched else None,
                                   indent=" " * 8),
        code=render_code(epilogue, indent=" " * 8),
    )
    if batched:
        ctx["kind_doc"] = _KIND_DOC_BATCHED
    return ctx


def _render(template: str, ctx: dict) -> str:
    text = with_helpers(triton_template(template).render(**ctx))
    compile(text, f"<{ctx['name']}>", "exec")  # fail here, with the text at hand, on a syntax error
    return text


def render_gemm(epilogue: Epilogue = IDENTITY, batched: bool = False, *, name: str = "kw_gemm") -> str:
    """Module text: ``{name}_kernel`` (C = A @ B + epilogue), ``{name}_epilogue_kernel``
    (the split-K epilogue pass) and ``launch(a, b, *operands, *, out_dtype=None, BLOCK_M, BLOCK_N,
    BLOCK_K, GROUP_M, SPLIT_K, INPUT_PRECISION, CAST_BF16, num_warps, num_stages)``."""
    ctx = _gemm_context(epilogue, name, batched)
    ctx.update(  # the epilogue again, in the split-K epilogue pass
        loads_pass=render_operand_loads(epilogue, "offs_m", "offs_n", "mask", batch="pid_b" if batched else None,
                                        indent=" " * 4),
        code_pass=render_code(epilogue, indent=" " * 4),
    )
    return _render("gemm.py.j2", ctx)


def render_gemm_rowreduce(
    epilogue: Epilogue = IDENTITY, batched: bool = False, *, name: str = "kw_gemm_rowreduce", row_code: str = ""
) -> str:
    """Module text: ``{name}_kernel`` (reduce each row of epilogue(A @ B) without writing the
    product) and ``launch(a, b, *operands, *, reduce="sum", out_dtype=None, BLOCK_M, BLOCK_N,
    BLOCK_K, INPUT_PRECISION, CAST_BF16, num_warps, num_stages)``; reduce is one of sum, mean,
    max, min, logsumexp (output [M]), softmax or log_softmax (output [M, N]).  `row_code`:
    statements applied to the reduced vector `res` before it is stored (e.g. ``res = res / 16.0``)."""
    ctx = _gemm_context(epilogue, name, batched)
    ctx.update(
        row_code=textwrap.indent(row_code, " " * 8) if row_code.strip() else "",
        row_code_doc=textwrap.indent(row_code, " " * 4),
        modes=repr(ROW_REDUCE_MODES), normalizations=repr(ROW_NORMALIZATIONS), whole_row=repr(WHOLE_ROW),
    )
    return _render("gemm_rowreduce.py.j2", ctx)


_CONV_FULL = (
    "n_idx[:, None] * stride_{name}_n + offs_n[None, :] * stride_{name}_c"
    " + oh[:, None] * stride_{name}_h + ow[:, None] * stride_{name}_w"
)


def _conv_context(epilogue: Epilogue, name: str) -> dict:
    ctx = _common_context(epilogue, name)
    ctx.update(
        params=operand_params(epilogue, full_strides=("n", "c", "h", "w")),
        loads=render_operand_loads(
            epilogue, "offs_m", "offs_n", "mask", mask_m="m_ok", mask_n="n_ok", full_offsets=_CONV_FULL,
            indent=" " * 4,
        ),
        code=render_code(epilogue, indent=" " * 4),
    )
    return ctx


def render_conv2d(epilogue: Epilogue = IDENTITY, *, name: str = "kw_conv2d") -> str:
    """Module text: ``{name}_kernel`` (implicit-GEMM conv2d, groups=1, + epilogue) and
    ``launch(x, w, *operands, *, stride=1, padding=0, dilation=1, NHWC=None, out_dtype=None,
    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, INPUT_PRECISION, CAST_BF16, num_warps, num_stages)``."""
    return _render("conv2d_implicit_gemm.py.j2", _conv_context(epilogue, name))


ROWS_KH = range(2, 8)  # kernel heights the row-streaming depthwise kernel is rendered for
ROWS_KW = range(1, 8)  # and widths (its KH * KW weights stay in registers)


def rows_kernel(kernel: tuple[int, int], stride: tuple, dilation: tuple) -> tuple[int, int] | None:
    """(KH, KW) when the row-streaming depthwise kernel computes a convolution with this kernel
    size, stride and dilation (ROWS_KH rows, ROWS_KW columns, row stride and dilation 1), else None."""
    kh, kw = int(kernel[0]), int(kernel[1])
    ok = kh in ROWS_KH and kw in ROWS_KW and int(stride[0]) == 1 and int(dilation[0]) == 1
    return (kh, kw) if ok else None


def render_depthwise(epilogue: Epilogue = IDENTITY, *, name: str = "kw_dwconv2d",
                     rows_kernel: tuple[int, int] | None = (3, 3), stats: bool = False,
                     prologue: Epilogue = IDENTITY) -> str:
    """Module text: ``{name}_kernel`` (direct depthwise conv2d, groups == Cin, + epilogue),
    ``{name}_rows_kernel`` (its row-streaming variant for kernels of `rows_kernel` = (KH, KW): one
    rolling accumulator per kernel row, the taps unrolled, the weights loaded once; None: no such
    kernel) and ``launch(x, w, *operands, *, stride=1, padding=0, dilation=1, out_dtype=None,
    out_channels_last, out, ROUND_X, BLOCK_M, BLOCK_N, BLOCK_W, ROWS, num_warps, num_stages)``;
    with `stats` launch also returns each program's partial statistics of y per (image, channel)
    and takes write_y (codegen/conv_norm.py); `prologue` (per-input-channel "col" and "scalar"
    operands, launch's prologue_operands) is applied to the input's values as they are loaded,
    before the convolution's zero padding."""
    if any(o.kind not in ("col", "scalar") for o in prologue.operands):
        raise ValueError("a prologue takes col (per input channel) and scalar operands only")
    Epilogue(epilogue.operands + prologue.operands)  # (raises on a name the two share)
    kh, kw = rows_kernel if rows_kernel is not None else (None, None)
    if rows_kernel is not None and (kh not in ROWS_KH or kw not in ROWS_KW):
        raise ValueError(f"rows_kernel={rows_kernel}: the row-streaming kernel is rendered for {ROWS_KH.start} to "
                         f"{ROWS_KH.stop - 1} kernel rows and {ROWS_KW.start} to {ROWS_KW.stop - 1} columns")
    ctx = _conv_context(epilogue, name)
    ctx.update(  # the epilogue again, inside the row-streaming kernel's loop
        rows_kh=kh, rows_kw=kw, stats=stats, prologue=prologue,
        prologue_params=[f"{o.name}_ptr" for o in prologue.operands],
        prologue_loads=render_operand_loads(prologue, "ch", "ch", "ok", mask_n="ch_ok", indent=" " * 4),
        prologue_code=render_code(prologue, indent=" " * 4),
        loop_loads=render_operand_loads(epilogue, "offs_m", "offs_n", "mask", mask_m="m_ok", mask_n="n_ok",
                                        full_offsets=_CONV_FULL, indent=" " * 8),
        loop_code=render_code(epilogue, indent=" " * 8),
    )
    return _render("depthwise_conv2d.py.j2", ctx)


# ----------------------------------------------------------------------------- launch arguments

def precision_kwargs(policy: str) -> dict:
    """Launch arguments for a precision policy name (fp32 / tf32 / bf16)."""
    table = {
        "fp32": dict(INPUT_PRECISION="ieee", CAST_BF16=False),
        "ieee": dict(INPUT_PRECISION="ieee", CAST_BF16=False),
        "tf32": dict(INPUT_PRECISION="tf32", CAST_BF16=False),
        "bf16": dict(INPUT_PRECISION="ieee", CAST_BF16=True),
    }
    try:
        return dict(table[policy])
    except KeyError:
        raise ValueError(f"unknown precision policy {policy!r}") from None


__all__ = [
    "render_gemm", "render_gemm_rowreduce", "render_conv2d", "render_depthwise", "rows_kernel", "precision_kwargs",
    "ROWS_KH", "ROWS_KW", "ROW_NORMALIZATIONS", "whole_row_block_n",
]
