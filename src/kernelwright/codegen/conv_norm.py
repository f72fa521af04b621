"""A convolution and the normalization group after it (an instance, group or layer norm over an
image's channels and spatial extent, or a training batch norm over a channel of every image, with
pointwise ops before and after it) as three kernels that pass over the convolution's output once
more only:

1. the convolution template (templates/triton/conv.py.j2, `stats`) computes the group's statements
   before the norm (the value it normalizes, t) as its epilogue, writes t, and stores each tile's
   partial statistics of t per (image, channel): count, mean and squared deviations about that
   mean;
2. `{name}_stats` combines the partials of each normalized row (an image's channel group, or a
   channel of every image) with Chan's formula into its mean and squared deviations' sum: what the
   group's Welford pass would compute, without reading t; and the group's values of one per row
   (a batch norm's new running statistics);
3. `{name}_apply` reads t once and runs the group's statements after the norm on it (the mean and
   sum per row loaded), writing the group's result; the convolution writes t in the result's
   layout, so both walk memory in order.

Against the convolution followed by the normalization kernel, t is read once instead of twice (a
row too long for one pass: its statistics, then the normalization), and the normalization is a
pointwise kernel walking memory in order.

A sum group (a sum or mean of a pointwise function of the convolution's output over each image's
pixels, which is all the group returns: a global average pool after an activation) has no apply
either, and the convolution writes no output at all: its epilogue computes the summed value t,
each tile keeps its partial statistics of t and writes nothing else, and the statistics kernel's
row sums (count times mean, over the partials) are the group's sums, after which it runs the
group's statements of one per row (`NormSplit.sums`). The convolution's output, of which only
the sums were kept, is then never in memory. Where the group also returns the summed value t
itself (a squeeze-and-excitation block's activations and their mean), the convolution writes t
as that result, and nothing reads it again for the sums; where it returns a value computed from
t and the sums (t less its mean), the convolution writes t and the apply pass reads it once (the
row buffers holding each row's mean and sum).

A statistics group (plan.norm_split: a norm before a pool, split into its statistics and a
pointwise apply that the pool reads as its prologue) has no apply here: the convolution writes its
own output, which the apply reads, and keeps its tiles' partial statistics, so the statistics'
reduction kernel does not read the output at all (`NormSplit.stats_only`). The value the group
reduces is the convolution's output, or that plus a value of one per channel (a convolution's
bias that norm_split adds back as each reader reads the output): the statistics kernel moves each
channel's partial mean by it, the squared deviations unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode
from kernelwright.codegen.triton_group import Stmt, Unsupported, lower
from kernelwright.plan.concat import placed_slot
from kernelwright.plan.fusion import Group

_DTYPES = ("float32", "bfloat16")


@dataclass
class NormSplit:
    """Where a normalization group splits around its statistics: `stmts` (its lowered statements),
    `welford` (the statistics statement: var the squared deviations' sum, code the mean; for a sum
    group its sum statement, var the sum), `t` (the variable it reads), `pre` (the statements
    computing t, the convolution's epilogue), `post` (the statements after the statistics, with
    the loads they share with `pre` first), and the
    rows it normalizes: per image (or, `over_batch`, over all images), `groups` rows of `per_row`
    channels each, `count` values a row."""

    stmts: list[Stmt]
    welford: Stmt
    t: str
    pre: list[Stmt]
    post: list[Stmt]
    own: Stmt  # the load of the convolution's output
    groups: int
    per_row: int
    count: int
    domain: tuple[int, ...]  # the group's domain, which its operands' strides run over
    channel_split: bool  # the domain splits the channels as [groups, per_row] (a group norm)
    rdims: tuple[int, ...]  # the domain dims a row spans (the group's reduced dims)
    over_batch: bool  # a row spans every image (a training batch norm: one row per channel)
    out: str  # the group's result of the convolution's shape (stats_only: the convolution's output)
    outputs: list[str]  # every value the kernels return, in order (the others are one per row)
    # a statistics group: no apply, the convolution writes its own output (module docstring)
    stats_only: bool = False
    shift: Stmt | None = None  # (stats_only) the load of a value of one per channel added before the statistics
    # a sum group: `welford` is a sum over each row, the group returns values of one per row and at
    # most one value of the convolution's shape (`out`: the summed value, which the convolution then
    # writes, or one the apply computes from it; with none the convolution writes nothing)
    sums: bool = False

    @property
    def writes(self) -> bool:
        """Whether the convolution kernel writes a result of its shape (all but a sum group returning
        values of one per row alone)."""
        return not self.sums or self.out in self.outputs

    @property
    def direct(self) -> bool:
        """Whether the convolution's written value is the group's result itself (a statistics
        group's output; a sum group's summed value), with no apply pass after the statistics."""
        if self.stats_only:
            return True
        return self.sums and self.writes and _store(self).deps[0] == self.t

    @property
    def operands(self) -> list[str]:
        """The graph values the statements after the statistics load (the apply's and the rows'),
        and the statistics' shift."""
        return list(dict.fromkeys([s.operand.value for s in self.post if s.kind == "load"]
                                  + ([self.shift.operand.value] if self.shift is not None else [])))


def match(graph: Graph, conv: OpNode, group: Group) -> NormSplit | str:
    """The split of `group` (module docstring) as the normalization after `conv`, or why not: the
    group normalizes rows of one image's channels (one channel, a channel group, or all of them)
    over every spatial position with one Welford pass over a value it computes pointwise from the
    convolution's output alone, writes one value of the output's shape, and the statements after
    the statistics read no value before them but that one (or operands); a convolution or
    transposed convolution (dense, grouped or depthwise: the statistics are kept per channel)
    whose output the group alone reads."""
    if group.rdims is None:
        return "not a normalization group"
    shape = tuple(conv.meta.shape)
    full = [v for v in group.outputs if tuple(graph.meta(v).shape) == shape]
    smaller = not full and all(graph.meta(v).numel < conv.meta.numel for v in group.outputs)
    try:
        stmts = list(lower(graph, group).stmts)
    except Unsupported as e:
        return str(e)
    reduces = [s for s in stmts if s.kind == "reduce"]
    sums = len(reduces) == 1 and reduces[0].op == "sum"
    stats_only = smaller and not sums
    if len(full) != 1 and not smaller:
        return "the group has no one result of the convolution's shape"
    out = graph.meta(full[0]) if full else conv.meta
    if out.dtype not in _DTYPES or conv.meta.dtype not in _DTYPES:
        return "the group's result is not a float32 / bf16 value"
    if any(placed_slot(graph, v) is not None for v in [*group.outputs, conv.name]):
        return "the group's result lies in a concatenation's buffer"
    if conv.name in graph.outputs or (not stats_only and any(u.name not in set(group.nodes)
                                                             for u in graph.users(conv.name))):
        return "the convolution's output is read outside the group"
    rows = _rows(tuple(group.domain), tuple(group.rdims), shape)
    if isinstance(rows, str):
        return rows
    groups, per_row, channel_split, over_batch = rows
    if len(reduces) != 1 or reduces[0].op != "welford" and not sums:
        return "the group's statistics are not one Welford pass (nor one sum returned per row alone)"
    welford = reduces[0]
    t = welford.deps[0]
    pre = _closure(stmts, [s for s in stmts if s.var == t])
    need = {s.var for s in pre}
    if any(s.kind not in ("load", "expr") or s.level != "full" and s.kind == "expr" for s in pre):
        return "the value normalized is not computed pointwise"
    owns = [s for s in pre if s.kind == "load" and s.operand.value == conv.name]
    if len(owns) != 1:
        return "the value normalized is not computed from the convolution's output"
    i = stmts.index(welford)
    post = [s for s in stmts[i + 1:] if s.var not in need]
    if any(s.kind == "reduce" for s in post) or [s.kind for s in stmts[:i] if s.var not in need]:
        return "statements before the statistics that the normalized value does not need"
    # an operand loaded before the statistics and read after them too (a scale applied on both
    # sides of the norm) is loaded again by the apply
    again = {d for s in post for d in s.deps}
    reloads = [s for s in pre if s.kind == "load" and s is not owns[0] and s.var in again]
    early = need - {t} - {s.var for s in reloads}
    if any(set(s.deps) & early for s in post):
        return "a statement after the statistics reads a value computed before them besides the normalized one"
    post = reloads + post
    stores = [s for s in post if s.kind == "store"]
    shift = None
    if stats_only:
        shift = _shift(pre, owns[0], channel_split)
        if len(pre) != 1 and shift is None:
            return "the statistics are not of the convolution's output (or it plus a value of one per channel)"
        if any(s.level != "row" for s in stores):
            return "the statistics group stores a value not of one per row"
    elif sums:
        if [s.operand.value for s in stores if s.level != "row"] not in ([], full):
            return "the sum group stores more than one value of the convolution's shape"
    elif [s.operand.value for s in stores if s.level == "full"] != full or \
            any(s.level != "row" for s in stores if s.operand.value != full[0]):
        return "the group stores values other than its result and values one per row"
    spatial = math.prod(shape[2:])
    count = per_row * spatial * (shape[0] if over_batch else 1)
    # (the kernels' one result of the convolution's shape; a sum group's is never written)
    out_value = conv.name if stats_only or sums and not full else full[0]
    outputs = ([conv.name] if stats_only else []) + [s.operand.value for s in stores]
    return NormSplit(stmts, welford, t, pre, post, owns[0], groups, per_row, count, tuple(group.domain),
                     channel_split, tuple(group.rdims), over_batch, out_value, outputs, stats_only, shift, sums)


def _shift(pre: list[Stmt], own: Stmt, channel_split: bool) -> Stmt | None:
    """The load of a value of one per channel that a statistics group adds to the convolution's
    output before its statistics (`pre`: load own, load it, their sum in either order), or None."""
    if len(pre) != 3:
        return None
    shift, add = [s for s in pre if s is not own][0], pre[-1]
    per_channel = shift.kind == "load" and not shift.operand.strides[0] and not any(
        shift.operand.strides[3 if channel_split else 2:])
    if per_channel and add.kind == "expr" and add.code in (f"({own.var} + {shift.var})", f"({shift.var} + {own.var})"):
        return shift
    return None


def _rows(domain: tuple, rdims: tuple, shape: tuple) -> tuple[int, int, bool, bool] | str:
    """(rows per image, channels per row, whether the domain splits the channels, whether a row
    spans every image) for a group over `domain` reducing `rdims` after a convolution of output
    `shape` [N, C, *spatial]: the domain is [N, C or (G, C / G), spatial...] (spatial dims merged
    or not), every spatial dim reduced, N kept and the channels kept (one per row), reduced (all of
    them a row) or split (G rows of C / G); or N reduced too and the channels kept (a row per
    channel over the batch)."""
    N, C, spatial = shape[0], shape[1], math.prod(shape[2:])
    if not domain or domain[0] != N or math.prod(domain) != N * C * spatial:
        return "the group's rows are not one image's channels"
    if 0 in rdims:  # one row per channel over every image (a training batch norm)
        rest = domain[2:]
        if len(domain) < 2 or domain[1] != C or 1 in rdims or math.prod(rest) != spatial \
                or any(d not in rdims for d in range(2, len(domain))):
            return "the group's rows are not one image's channels, nor one channel of every image"
        return C, 1, False, True
    split = len(domain) >= 3 and domain[1] * domain[2] == C and domain[1] not in (1, C)
    rest = domain[3:] if split else domain[2:]
    if math.prod(rest) != spatial or any(d not in rdims for d in range(len(domain) - len(rest), len(domain))):
        return "the group does not normalize over every spatial position"
    if split:
        if 1 in rdims or 2 not in rdims:
            return "a channel split whose groups are not the rows"
        return domain[1], domain[2], True, False
    return (1, C, False, False) if 1 in rdims else (C, 1, False, False)


def _closure(stmts: list[Stmt], roots: list[Stmt]) -> list[Stmt]:
    """The statements of `stmts` that `roots` need (themselves included), in order."""
    by_var = {st.var: st for st in stmts}
    need, todo = set(), [st.var for st in roots]
    while todo:
        v = todo.pop()
        if v in need or v not in by_var:
            continue
        need.add(v)
        todo += list(by_var[v].deps)
    return [st for st in stmts if st.var in need]


def apply_loads(split: NormSplit) -> list[Stmt]:
    """The loads of the apply kernel (its pointer arguments after t and the statistics)."""
    return [st for st in _closure(split.post, [_store(split)]) if st.kind == "load"]


def row_statements(split: NormSplit) -> list[Stmt]:
    """The statements computing the group's values of one per row (new running statistics), run by
    the statistics kernel."""
    return _closure(split.post, [st for st in split.post if st.kind == "store" and st.level == "row"])


def _store(split: NormSplit) -> Stmt:
    return next(st for st in split.post if st.kind == "store" and st.operand.value == split.out)


def kernels(split: NormSplit, name: str) -> str:
    """The source of `{name}_stats` and (but for a statistics group) `{name}_apply` (module
    docstring) for `split`; the module's launch() calls them (conv_epilogue.render)."""
    stats = _stats_kernel(split, name)
    if split.direct or not split.writes:
        return stats
    store = _store(split)
    applied = _closure(split.post, [store])
    post_loads = [st for st in applied if st.kind == "load"]
    domain = split.domain
    order = sorted(range(len(domain)), key=lambda d: (-store.operand.strides[d], d))
    # int32 index arithmetic (divisions by constants become multiplies) unless an offset passes 2**31
    reach = max([math.prod(domain) + 1024] + [sum((n - 1) * abs(st) for n, st in zip(domain, s.operand.strides))
                                              for s in post_loads + [store]])
    pid = "tl.program_id(0).to(tl.int64)" if reach >= 2**31 else "tl.program_id(0)"
    lines = [f"    o = {pid} * BLOCK + tl.arange(0, BLOCK)",
             f"    mask = o < {math.prod(domain)}"]
    inner = 1
    idx = {}
    for d in reversed(order):  # the domain's indices, walked in the result's memory order
        idx[d] = f"i{d}"
        lines.append(f"    i{d} = (o // {inner}) % {domain[d]}" if inner > 1 else f"    i{d} = o % {domain[d]}")
        inner *= domain[d]

    if split.over_batch:
        lines.append("    row = i1")
    else:
        lines.append("    row = i0" if split.groups == 1 else f"    row = i0 * {split.groups} + i1")
    if not split.sums:  # (a sum group's row buffers hold its mean and its sum)
        lines.append(f"    {split.welford.code} = tl.load(mean_ptr + row, mask=mask, other=0.0)")
    lines.append(f"    {split.welford.var} = tl.load(m2_ptr + row, mask=mask, other=0.0)")
    # (t lies in the result's layout: the convolution writes it so)
    lines.append(f"    {split.t} = tl.load(t_ptr + {_offset(store.operand.strides, idx)}, mask=mask, other=0.0)"
                 ".to(tl.float32)")
    params = ["t_ptr", "mean_ptr", "m2_ptr"] + [f"{s.var}_ptr" for s in post_loads] + ["out_ptr"]
    for s in applied:
        if s.kind == "load" and not any(s.operand.strides):  # (a 0-d operand: one value)
            lines.append(f"    {s.var} = tl.load({s.var}_ptr).to(tl.float32)")
        elif s.kind == "load":
            lines.append(f"    {s.var} = tl.load({s.var}_ptr + {_offset(s.operand.strides, idx)}, mask=mask, other=0.0)"
                         ".to(tl.float32)")
        elif s.kind == "expr":
            lines.append(f"    {s.var} = {s.code}")
        elif s.kind == "store":
            lines.append(f"    tl.store(out_ptr + {_offset(s.operand.strides, idx)}, kw_cast_out({s.deps[0]}, out_ptr), "
                         "mask=mask)")
    return stats + f'''

@triton.jit
def {name}_apply({", ".join(params)}, BLOCK: tl.constexpr):
    """The group's statements after its statistics, on t (the convolution's epilogue result),
    walked in the memory order of the result."""
{chr(10).join(lines)}
'''


def _offset(strides, index) -> str:
    return " + ".join(f"{index[d]} * {s}" if s != 1 else index[d] for d, s in enumerate(strides) if s) or "0"


def _stats_kernel(split: NormSplit, name: str) -> str:
    """`{name}_stats`: a row's partials combined, and the group's values of one per row."""
    domain = split.domain
    # the values of one per row, in the statistics kernel: the row's domain indices (kept dims)
    rows = row_statements(split)
    kept = [d for d in range(len(domain)) if d not in split.rdims]
    row_index, rest, row_lines = {}, "r", []
    for d in reversed(kept):
        row_index[d] = f"k{d}"
        row_lines.append(f"    k{d} = {rest} % {domain[d]}")
        rest = f"({rest} // {domain[d]})"
    row_params = []
    for st in rows:
        if st.kind == "load":
            row_params.append(f"{st.var}_ptr")
            row_lines.append(f"    {st.var} = tl.load({st.var}_ptr + {_offset(st.operand.strides, row_index)}).to(tl.float32)")
        elif st.kind == "expr":
            row_lines.append(f"    {st.var} = {st.code}")
        elif st.kind == "store":
            row_params.append(f"{st.var}_ptr")
            row_lines.append(f"    tl.store({st.var}_ptr + {_offset(st.operand.strides, row_index)}, "
                             f"kw_cast_out({st.deps[0]}, {st.var}_ptr))")
    found = f"    {split.welford.var} = wsum\n" if split.sums else \
        f"    {split.welford.code} = mean\n    {split.welford.var} = tl.sum(dev, axis=0)\n"
    row_code = ("\n    # the group's values of one per row\n" + found + "\n".join(row_lines)) if rows else ""
    images = "IMAGES" if split.over_batch else "1"
    shift, shift_param = "", ""
    if split.shift is not None:  # (a value of one per channel added before the statistics: each mean moves by it)
        st = split.shift.operand.strides
        at = f"(ch // {split.per_row}) * {st[1]} + (ch % {split.per_row}) * {st[2]}" if split.channel_split else \
            f"ch * {st[1]}"
        shift = f" + tl.load(shift_ptr + {at}, mask=cnt > 0, other=0.0).to(tl.float32)"
        shift_param = "shift_ptr, "
    deviations = f"""    dev = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, parts, BLOCK):
        i = start + tl.arange(0, BLOCK)
        ch = c0 + (i % per_image) // SLOTS
        at = ((n0 + i // per_image).to(tl.int64) * SLOTS + i % SLOTS) * C + ch
        cnt = tl.load(cnt_ptr + at, mask=i < parts, other=0.0)
        d = tl.load(mean_ptr + at, mask=cnt > 0, other=0.0){shift} - mean
        dev += tl.where(cnt > 0, tl.load(m2_ptr + at, mask=cnt > 0, other=0.0) + cnt * d * d, 0.0)
"""
    return f'''

@triton.jit
def {name}_stats(cnt_ptr, mean_ptr, m2_ptr, {shift_param}row_mean_ptr, row_m2_ptr, {"".join(p + ", " for p in row_params)}SLOTS, C,
                 IMAGES, GROUPS: tl.constexpr, PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """One {"summed" if split.sums else "normalized"} row ({"a channel over every image" if split.over_batch else "an image's channel group"}): its partials [image, slot, channel] of
    the convolution's tiles combined ({"the row's sum, count x mean over them" if split.sums else "Chan: the mean and the squared deviations' sum of the row"})."""
    r = tl.program_id(0)
    n0 = {"0" if split.over_batch else "r // GROUPS"}
    c0 = (r % GROUPS) * PER_ROW
    per_image = SLOTS * PER_ROW
    parts = {images} * per_image
    total = tl.zeros((BLOCK,), tl.float32)
    weighted = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, parts, BLOCK):
        i = start + tl.arange(0, BLOCK)
        ch = c0 + (i % per_image) // SLOTS
        at = ((n0 + i // per_image).to(tl.int64) * SLOTS + i % SLOTS) * C + ch
        cnt = tl.load(cnt_ptr + at, mask=i < parts, other=0.0)
        total += cnt
        weighted += cnt * (tl.load(mean_ptr + at, mask=cnt > 0, other=0.0){shift})
    wsum = tl.sum(weighted, axis=0)
    mean = wsum / tl.sum(total, axis=0)
{"" if split.sums else deviations}    tl.store(row_mean_ptr + r, mean)
    tl.store(row_m2_ptr + r, {"wsum" if split.sums else "tl.sum(dev, axis=0)"}){row_code}
'''

