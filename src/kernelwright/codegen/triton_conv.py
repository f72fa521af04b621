"""The implicit-GEMM convolution template: every dense, grouped and depthwise convolution and
transposed convolution with 1, 2 or 3 spatial dims, with a fused epilogue
(templates/triton/conv.py.j2).

:func:`render_conv` returns the text of a self-contained module (torch + triton only) holding
``{name}_kernel`` and a documented ``launch(x, w, *epilogue_operands, stride, padding, dilation,
groups, output_padding, out_dtype, out_channels_last, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
INPUT_PRECISION, CAST_BF16, num_warps, num_stages)`` whose result is that of
``torch.ops.aten.convolution(x, w, None, stride, padding, dilation, transposed, output_padding,
groups)`` followed by the epilogue.  Its schedule space is :func:`kernelwright.space.conv_space.conv_space`.

The epilogue reads ``acc``, the [BLOCK_M output pixels, BLOCK_N output channels] tile of one
group; its operands are "col" (one value per output channel, [Cout]), "full" (the output's
logical shape [batch, Cout, *spatial], any strides, 0 where it broadcasts) or "scalar" (0-d).
"""
from __future__ import annotations

from kernelwright.codegen.epilogue import (
    IDENTITY,
    Epilogue,
    operand_params,
    render_code,
    render_operand_loads,
)
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template

TEMPLATE = "conv.py.j2"
FULL_STRIDES = ("n", "c", "d", "h", "w")  # a "full" operand's strides, over the output as 5-D
# a "full" operand's element offset over the tile (int64 output coordinates from the template)
_FULL = " + ".join(f"o_{d}{'[None, :]' if d == 'c' else '[:, None]'} * stride_{{name}}_{d}" for d in FULL_STRIDES)
_KIND_DOC = {
    "col": "one value per output channel: Cout elements (e.g. a bias)",
    "full": "a tensor expandable to the output's [batch, Cout, *spatial]; any strides, broadcast views "
            "(stride 0) need no copy",
    "scalar": "a 0-d tensor",
}


def render_conv(epilogue: Epilogue = IDENTITY, *, name: str = "kw_conv", transposed: bool = False,
                pool: str | None = None, post: Epilogue = IDENTITY, row_out: bool = False,
                whole_n: bool = False, prologue: Epilogue = IDENTITY,
                in_pool: tuple[tuple[int, ...], tuple[int, ...]] | None = None, stats: bool = False) -> str:
    """Module text of the convolution template (``transposed``: a transposed convolution, weight
    [Cin, Cout / groups, *kernel]) with `epilogue` fused; ``{name}_kernel`` and ``launch``.

    pool: "max" or "avg": the epilogue's result is pooled over windows as large as their stride
    (launch's ``pool_window``; no padding, floor mode), then `post` runs on the pooled tile (its
    operands over the pooled output; names distinct from the epilogue's). Convolutions only: a
    transposed convolution's programs own one stride phase class, never a whole window.
    row_out: the last epilogue reduced over the channels (its result is one value per pixel,
    ``[BLOCK_M, 1]``): y has one channel. whole_n (implied by row_out): an epilogue reduces over the
    channels, so launch refuses tiles narrower than Cout and grouped convolutions.
    A "row" operand (per output pixel) is a ValueError: the conv epilogue has no row view.
    prologue: statements applied to the input's values as they are loaded (``acc``: a [pixels, K]
    tile of them in float32; its operands "col", one value per input channel, or "scalar", named
    apart from the epilogue's), before the convolution's zero padding: launch's
    ``prologue_operands``.
    in_pool: ((kd, kh, kw), (pd, ph, pw)): the input is max-pooled with that window and padding at
    stride 1 (a pooled tensor of the input's shape: an Inception module's pool branch) as it is
    loaded, in the per-tap channel-block loads (launch refuses boxes, rows and folded taps); not
    with a prologue.
    stats: launch also returns the per-(image, channel) statistics of the values y holds, as
    partials (a normalization after the convolution then needs no pass of its own over y to get
    them; codegen/conv_norm.py); (transposed) convolutions without a pool or a channel reduction only."""
    if not name.isidentifier():
        raise ValueError(f"kernel name {name!r} is not a Python identifier")
    if pool not in (None, "max", "avg"):
        raise ValueError(f"pool={pool!r}: 'max', 'avg' or None")
    if pool and transposed:
        raise ValueError("pooling is fused into convolutions only, not transposed ones")
    if not pool and not post.empty:
        raise ValueError("a post-pooling epilogue needs pool")
    both = Epilogue(epilogue.operands + post.operands, epilogue.code)  # (raises on a repeated name)
    Epilogue(both.operands + prologue.operands)  # (likewise)
    if in_pool is not None:
        if transposed or not prologue.empty:
            raise ValueError("an input pool is fused into a convolution without a prologue only")
        (kd, kh, kw), (pd, ph, pw) = in_pool
        if any(k % 2 == 0 or p != (k - 1) // 2 for k, p in zip((kd, kh, kw), (pd, ph, pw))):
            raise ValueError(f"input pool {in_pool}: odd windows padded by half (the input's shape kept)")
    if stats and (pool or row_out):
        raise ValueError("statistics come from convolutions without a pool or a channel reduction only")
    if any(o.kind not in ("col", "scalar") for o in prologue.operands):
        raise ValueError("a prologue takes col (per input channel) and scalar operands only")
    rows = [o.name for o in both.operands if o.kind == "row"]
    if rows:
        raise ValueError(f"the convolution template takes col, full and scalar epilogue operands, not row ({rows})")
    stages = [(o.name, o.kind, "pre") for o in epilogue.operands] + [(o.name, o.kind, "post") for o in post.operands]
    loads = dict(mask_m="m_ok", mask_n="n_ok", full_offsets=_FULL, indent=" " * 4)
    ctx = dict(
        name=name,
        transposed=bool(transposed),
        epilogue=both,
        pool=pool,
        row_out=bool(row_out),
        whole_n=bool(whole_n or row_out),
        in_pool=None if in_pool is None else dict(
            k=tuple(in_pool[0]), p=tuple(in_pool[1]),
            offsets=[(a - in_pool[1][0], b - in_pool[1][1], c - in_pool[1][2]) for a in range(in_pool[0][0])
                     for b in range(in_pool[0][1]) for c in range(in_pool[0][2])]),
        operand_spec=repr(tuple(stages)),
        params=operand_params(both, full_strides=FULL_STRIDES),
        loads=render_operand_loads(epilogue, "offs_m", "co", "mask", **loads),
        code=render_code(epilogue, indent=" " * 4),
        prologue=prologue,
        prologue_params=[f"{o.name}_ptr" for o in prologue.operands],
        prologue_loads=render_operand_loads(prologue, "ch", "ch", "ok", mask_n="ch_ok", indent=" " * 4),
        prologue_code=render_code(prologue, indent=" " * 4),
        post_loads=render_operand_loads(post, "offs_m", "co", "mask", **loads),
        post_code=render_code(post, indent=" " * 4),
        code_doc=render_code(epilogue, indent=" " * 4) + (
            f"\n    then {pool}-pooled, then:\n" + render_code(post, indent=" " * 4) if not post.empty else
            (f"\n    then {pool}-pooled" if pool else "")),
        kind_doc=_KIND_DOC,
        stats=bool(stats),
    )
    text = with_helpers(triton_template(TEMPLATE).render(**ctx))
    compile(text, f"<{name}>", "exec")  # fail here, with the text at hand, on a syntax error
    return text


__all__ = ["render_conv", "FULL_STRIDES"]
