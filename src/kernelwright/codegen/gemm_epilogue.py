"""GEMM with its pointwise epilogue group fused in: a library GEMM node (mm / addmm) whose only
consumer is a pointwise group becomes one Triton GEMM (templates/triton/gemm.py.j2) whose
epilogue is that group's expressions (same op table, same statements as the group kernel).

A group that reduces rows of N <= ROW_REDUCTION_MAX_N becomes one Triton GEMM that reduces each
row in registers (templates/triton/gemm_rowreduce.py.j2): the [M, N] product is never written.
Rows ending in one sum / max / min, possibly followed by arithmetic on the reduced value (Linear ->
sigmoid -> sum(dim=1); a mean's division; a norm's square root), in a logsumexp, or in a softmax /
log-softmax use the template's own reductions (which also walk rows wider than a tile); any other
row reduction (a layer norm; a group norm's G segments of each row) runs statement by statement
on the tile holding whole rows, rendered as the group kernel renders a row in one tile.

Under the bf16 policy the GEMM reads bf16 copies of its operands (plan.rewrites.bf16_operands).
An operand cast that is a group of its own, read by this GEMM alone, is absorbed: the fused
kernel loads the float32 source and rounds each tile to bf16 (CAST_BF16, round to nearest even,
as the cast kernel does), so the bf16 copy is never written. The accumulator stays float32 into
the epilogue (the library GEMM rounds its result to bf16 first; the fused kernel is closer to
the float64 reference, never further).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.ops import GEMMS
from kernelwright.codegen.triton_gemm import (ROW_NORMALIZATIONS, precision_kwargs, render_gemm, render_gemm_rowreduce,
                                              whole_row_block_n)
from kernelwright.codegen.triton_group import Lowering, Unsupported, lower, reduce_tile_lines
from kernelwright.plan.fusion import Group
from kernelwright.plan.rewrites import plain_cast
from kernelwright.plan.weights import weight_roots



@dataclass
class GemmEpilogue:
    gemm: OpNode
    group: Group
    epilogue: Epilogue
    a: str  # graph value of A [M, K]
    b: str  # graph value of B [K, N]
    operands: list[str]  # graph values for the epilogue operands, in order
    M: int
    N: int
    K: int
    out_dtype: str = "float32"  # dtype of the group's output
    prologue: tuple[Group, ...] = ()  # operand-cast groups the kernel absorbs (bf16 policy)
    out_shape: tuple[int, ...] = ()  # the group's output when it is a row-major view of [M, N] (else ())
    flat: tuple[str, ...] = ()  # operands of another rank the epilogue reads as row-major [M, N]
    # over each row after the epilogue: "sum" / "max" / "min" (output [M], then `row_code` on it),
    # "logsumexp" (output [M]) or "softmax" / "log_softmax" (output [M, N])
    reduce: str | None = None
    row_code: str = ""  # statements turning the reduced `res` ([BLOCK_M]) into the output, e.g. a mean's / N

    def k_major(self, graph: Graph) -> bool:
        """Both operands have unit stride along K (A [M, K] row-major, B = W.T of a row-major W):
        the layout TMA tile loads (and TF32 wgmma) need."""
        return graph.meta(self.a).stride[1] == 1 and graph.meta(self.b).stride[0] == 1

    @property
    def cast_bf16(self) -> bool:
        """Whether the operands are rounded to bf16 in the kernel (the GEMM is a bf16 GEMM)."""
        return self.gemm.meta.dtype == "bfloat16"

    @property
    def inputs(self) -> list[str]:
        return list(dict.fromkeys([self.a, self.b] + self.operands))


ROW_REDUCTIONS = ("sum", "max", "min")
# The row-reduction GEMM runs one program per BLOCK_M rows through all N columns: where a row fits
# one tile it skips the product's write and re-read; at N = 4096 (gemm_sigmoid_sum, H200) its best
# config took 0.85-0.95 ms against 0.40 (bf16) / 0.74 (tf32) for cuBLAS + a reduction kernel
# (its programs re-read all of B from L2), so wider rows are left to the library path.
ROW_REDUCTION_MAX_N = 256


def row_segments(group: Group, M: int, N: int) -> tuple[int, int] | None:
    """(G, S) when `group` (over a domain that is the GEMM's [M, N] output, possibly with N split
    into more dims) reduces each row's G consecutive segments of S columns: a layer norm or a row
    sum is (1, N), a group norm over [M, G, N / G] (G, N / G); None for any other reduction."""
    D, rd = tuple(group.domain), tuple(sorted(group.rdims or ()))
    if not rd or len(D) < 2 or D[0] != M or math.prod(D[1:]) != N or rd != tuple(range(rd[0], len(D))) \
            or rd[0] < 1:
        return None
    return math.prod(D[1:rd[0]]), math.prod(D[rd[0]:])


def fusable(graph: Graph, gemm: OpNode, group: Group) -> str | None:
    """None when `gemm`'s output feeds only `group` and the group can be its epilogue: pointwise,
    or reducing rows (or segments of rows) of at most ROW_REDUCTION_MAX_N (how the reduction is
    fused, `build` finds out); else the reason."""
    if gemm.target not in GEMMS:
        return "not an mm/addmm"
    M, N = gemm.meta.shape
    if group.rdims is not None and (group.kind not in ("reduction", "normalization")
                                    or row_segments(group, M, N) is None):
        return "epilogue group has reductions other than one over each row"
    if gemm.name in graph.outputs or gemm.name in graph.mutations:
        return "the GEMM output itself is a model output"
    members = set(group.nodes)
    if any(u.name not in members for u in graph.users(gemm.name)):
        return "the GEMM output has consumers outside the group"
    if len(group.outputs) != 1 or (tuple(group.domain) != (M, N) and group.rdims is None):
        return "the group must produce one value of the GEMM's shape"
    if gemm.meta.dtype not in ("float32", "bfloat16"):
        return "float32 or bf16 GEMMs only"
    if group.rdims is not None and N > ROW_REDUCTION_MAX_N:
        return f"a row of {N} does not fit one tile (row reductions: N <= {ROW_REDUCTION_MAX_N})"
    return None


def _absorbable_cast(graph: Graph, gemm: OpNode, value: str, groups: list[Group], weights) -> Group | None:
    """The group that is nothing but the float32 -> bf16 cast producing `value`, when this GEMM
    is the value's only reader and the value is not a weight's (`weights`: plan.weights.weight_roots;
    the forward casts a weight once per parameter version, emit/program.py: the GEMM then reads
    the bf16 copy)."""
    if graph.is_input(value) or value in weights or value in graph.outputs:
        return None
    node = graph.node(value)
    if not plain_cast(graph, node) or node.meta.dtype != "bfloat16" \
            or graph.meta(node.args[0].name).dtype != "float32" \
            or [u.name for u in graph.users(value)] != [gemm.name]:
        return None
    return next((g for g in groups if g.nodes == [value] and g.outputs == [value]), None)


def build(graph: Graph, gemm: OpNode, group: Group, groups: list[Group] = ()) -> GemmEpilogue:
    """The epilogue (operands + statements) for `group` applied to `gemm`'s accumulator, and the
    row reduction after it if the group ends in one; with the plan's `groups`, bf16 operand casts
    are absorbed (module docstring). A reducing group that is not one of the template's own
    reductions (a sum / max / min with row code, a logsumexp, a softmax) is rendered statement by
    statement on the whole row in one tile ("tile" / "tile_row": a layer or group norm)."""
    why = fusable(graph, gemm, group)
    if why:
        raise Unsupported(why)
    low: Lowering = lower(graph, group)
    if gemm.target == "aten.addmm.default":
        bias, a, b = gemm.args[0], gemm.args[1], gemm.args[2]
        beta, alpha = float(gemm.kwargs.get("beta", 1)), float(gemm.kwargs.get("alpha", 1))
    else:
        bias, (a, b), beta, alpha = None, gemm.args[:2], 0.0, 1.0
    M, K = graph.meta(a.name).shape
    N = graph.meta(b.name).shape[1]
    a_src, b_src, prologue = a.name, b.name, []
    if gemm.meta.dtype == "bfloat16":
        weights = weight_roots(graph)
        for which, ref in (("a", a), ("b", b)):
            cast = _absorbable_cast(graph, gemm, ref.name, list(groups), weights)
            if cast is not None and cast not in prologue:
                prologue.append(cast)
                src = graph.node(ref.name).args[0].name
                a_src, b_src = (src, b_src) if which == "a" else (a_src, src)
    head = None
    if bias is not None and beta != 0.0:
        meta = graph.meta(bias.name)
        head = (bias.name, low._domain_strides(meta, "full", shape=(M, N)), beta)
    elif alpha != 1.0:
        head = (None, None, None)
    seg = row_segments(group, M, N) if group.rdims is not None else None
    try:
        if seg is not None and seg[0] != 1:
            raise Unsupported("the reduction is over segments of each row")
        t = _Translation(graph, gemm, group, low, M, N, alpha, head)
        t.run()
    except Unsupported as first:
        if seg is None:
            raise
        try:
            t = _Translation(graph, gemm, group, low, M, N, alpha, head, whole_row=seg)
            t.run()
        except Unsupported as second:
            raise Unsupported(f"{first}; nor as a whole row in one tile: {second}") from None
    out = graph.meta(group.outputs[0])
    row_output = t.reduce is not None and t.reduce not in ROW_NORMALIZATIONS  # one value per row
    if row_output:
        if out.dtype not in ("float32", "bfloat16") or not _row_major(out, M):
            raise Unsupported(f"the reduced output {list(out.shape)} is not [M] (or [M, 1])")
    elif tuple(out.shape) != (M, N) and not _row_major(out, M * N):
        raise Unsupported(f"the epilogue's output {list(out.shape)} is not a row-major view of [M, N]")
    natural = (M,) if row_output else (M, N)  # what the template returns
    return GemmEpilogue(gemm, group, Epilogue(tuple(t.ops), "\n".join(t.code)), a_src, b_src, t.values, M, N, K,
                        out.dtype, tuple(prologue), tuple(out.shape) if tuple(out.shape) != natural else (),
                        tuple(dict.fromkeys(t.flat)), t.reduce,
                        "\n".join(t.row_code) if t.reduce in ROW_REDUCTIONS else "")


class _Translation:
    """The group's lowered statements as epilogue code on the GEMM's accumulator tile.

    Default: pointwise statements, ending at one of the template's own row reductions (a sum /
    max / min, then per-row code; a logsumexp; a softmax / log-softmax). With `whole_row` = (G, S)
    every statement runs on the tile holding whole rows ("tile" / "tile_row" modes), reductions
    included (triton_group.reduce_tile_lines); where G > 1 the tile is viewed [BLOCK_M, G, S] and
    each of a row's G segments of S columns is reduced (G and S powers of two, G * S = N)."""

    def __init__(self, graph, gemm, group, low, M, N, alpha, head, whole_row=None):
        self.graph, self.gemm, self.group, self.low = graph, gemm, group, low
        self.M, self.N, self.alpha, self.head, self.whole_row = M, N, alpha, head, whole_row
        self.ops: list[EpilogueOperand] = []
        self.values: list[str] = []
        self.code: list[str] = []
        self.flat: list[str] = []
        self.row_code: list[str] = []
        self.reduce: str | None = None

    def operand(self, value: str, domain_strides) -> str:
        """A new epilogue operand reading `value` (its strides in the group's domain); its name."""
        M, N = self.M, self.N
        strides = _matrix_strides(tuple(domain_strides), tuple(self.group.domain), N)
        meta = self.graph.meta(value)
        if len(meta.shape) > 2:  # e.g. a residual [B, T, C] added to the GEMM's [B*T, C] result
            if strides != (N, 1) or not _row_major(meta, M * N):
                raise Unsupported(f"epilogue operand {value} {list(meta.shape)} is not read as row-major [M, N]")
            self.flat.append(value)
        if all(s == 0 for s in strides):
            kind = "scalar"
        elif strides[0] == 0:
            kind = "col"
        elif strides[1] == 0:
            kind = "row"
        else:
            kind = "full"
        name = f"e{len(self.ops)}"
        self.ops.append(EpilogueOperand(name, kind))
        self.values.append(value)
        return name

    def run(self):
        acc = "acc" if self.alpha == 1.0 else f"acc * {self.alpha!r}"
        if self.head is not None and self.head[0] is not None:
            value, strides, beta = self.head
            bname = self.operand(value, strides)
            self.code.append(f"acc = {acc} + {bname}" + ("" if beta == 1.0 else f" * {beta!r}"))
        elif self.alpha != 1.0:
            self.code.append(f"acc = {acc}")
        if self.whole_row is not None:
            return self._whole_row()
        group, stmts, reduced = self.group, list(self.low.stmts), None
        code, row_code = self.code, self.row_code
        for i, st in enumerate(stmts):
            if reduced is not None:  # after a sum / max / min: per-row statements on the reduced value
                row_code.append(_after_reduction(st, reduced, row_code))
                continue
            if st.kind == "load":
                code.append(f"{st.var} = {self._load(st)}")
            elif st.kind == "expr":
                code.append(f"{st.var} = {st.code}")
            elif st.kind == "reduce" and st.op == "max" and group.rdims is not None \
                    and _is_logsumexp(self.graph, stmts[i:]):
                self.reduce = "logsumexp"  # the rest of the group, matched as a whole
                code.append(f"acc = {st.deps[0]}")
                break
            elif st.kind == "reduce" and st.op in ROW_REDUCTIONS and group.rdims is not None:
                code.append(f"acc = {st.deps[0]}")  # the epilogue ends here; the template reduces acc
                self.reduce, reduced = st.op, st.var
                row_code.append(f"{st.var} = res")
            elif st.kind == "reduce" and st.op == "online_softmax" and group.rdims is not None:
                self.reduce = _normalization(stmts[i:])  # the rest of the group, matched as a whole
                code.append(f"acc = {st.deps[0]}")
                break
            elif st.kind == "store":
                code.append(f"acc = {st.deps[0]}")
            else:
                raise Unsupported(f"statement {st.kind} {getattr(st, 'op', '')} in a GEMM epilogue")
        if group.rdims is not None and self.reduce is None:
            raise Unsupported("the group's reduction is not a sum, max or min over the rows, a logsumexp, a softmax "
                              "or a log-softmax")

    def _load(self, st, shape: str | None = None) -> str:
        """The tile an epilogue load statement reads: the accumulator for the GEMM's output, else an
        operand (`shape`: the [BLOCK_M, G, S] view of row segments, where there are several)."""
        op = st.operand
        if op.value == self.gemm.name:
            if _matrix_strides(tuple(op.strides), tuple(self.group.domain), self.N) != (self.N, 1):
                raise Unsupported("the group reads the GEMM output through a view")
            return "acc" if shape is None else f"tl.reshape(acc, {shape})"
        name = self.operand(op.value, op.strides)
        kind = self.ops[-1].kind
        if shape is None or kind == "scalar":
            return name
        if kind == "row":
            return f"{name}[:, :, None]"
        return f"tl.reshape({name}, {shape.replace('BLOCK_M', '1') if kind == 'col' else shape})"

    def _whole_row(self):
        """Every statement on the whole-row tile; the store ends in `acc` ([M, N] output) or `res`."""
        G, S = self.whole_row
        if G > 1 and (G & (G - 1) or S & (S - 1)):
            raise Unsupported(f"{G} segments of {S} columns: a segmented row needs powers of two")
        shape = None if G == 1 else f"(BLOCK_M, {G}, {S})"
        mask = "mask" if G == 1 else "row_mask[:, None, None]"  # a row of N = G * S columns fills BLOCK_N
        axis = 1 if G == 1 else 2
        stores = [st for st in self.low.stmts if st.kind == "store"]
        if len(stores) != 1:
            raise Unsupported(f"{len(stores)} stores in a whole-row epilogue")
        for st in self.low.stmts:
            if st.kind == "load":
                self.code.append(f"{st.var} = {self._load(st, shape)}")
            elif st.kind == "expr":
                self.code.append(f"{st.var} = {st.code}")
            elif st.kind == "reduce":
                if st.op not in ("sum", "max", "min", "welford", "online_softmax"):
                    raise Unsupported(f"a {st.op} in a whole-row epilogue")
                self.code += reduce_tile_lines(st, S, mask=mask, axis=axis)
            elif st.level == "full":  # the store
                self.reduce = "tile"
                self.code.append(f"acc = {st.deps[0]}" if G == 1 else f"acc = tl.reshape({st.deps[0]}, (BLOCK_M, BLOCK_N))")
            elif st.level == "row" and G == 1:
                self.reduce = "tile_row"
                self.code.append(f"res = tl.sum({st.deps[0]}, axis=1)")  # [BLOCK_M, 1] -> [BLOCK_M]
            else:
                raise Unsupported(f"a {st.level} output of a segmented row")


def _matrix_strides(strides: tuple, domain: tuple, N: int) -> tuple[int, int]:
    """An operand's strides over the group's domain ([M, ...] whose dims after the first flatten to
    the GEMM's N columns) as strides over [M, N]; Unsupported unless it is constant along the
    columns or steps through them evenly."""
    if len(domain) == 2:
        return strides
    inner = [(size, st) for size, st in zip(domain[1:], strides[1:]) if size != 1]
    sn = inner[-1][1] if inner else 0
    expect = sn
    for size, st in reversed(inner):
        if st != expect:
            raise Unsupported(f"strides {strides} over {domain} are not a [M, N] matrix's")
        expect *= size
    return strides[0], sn


def _after_reduction(st, reduced: str, row_code: list[str]) -> str:
    """One statement after a row sum / max / min as row code: expressions of the reduced value
    (and of earlier such expressions) and constants, e.g. a mean's division; the store names the
    output. Anything reading another operand is refused."""
    known = {reduced} | {line.split(" = ", 1)[0] for line in row_code}
    if st.kind == "expr" and st.level == "row" and set(st.deps) <= known:
        return f"{st.var} = {st.code}"
    if st.kind == "store" and st.deps[0] in known:
        return f"res = {st.deps[0]}"
    raise Unsupported("after the row reduction the group reads more than the reduced value")


def _is_logsumexp(graph: Graph, stmts) -> bool:
    """Whether the statements from a row max on are exactly torch.logsumexp's decomposition of the
    max's input x: m = amax(x); s = where(|m| == inf, 0, m); log(sum(exp(x - s))) + s."""
    red, rest = stmts[0], stmts[1:]
    x, m = red.deps[0], red.var
    exprs = {st.var: st.code for st in rest if st.kind == "expr"}
    # the 0 is a scalar_tensor node, or the literal once the rewrites folded it into the where
    zeros = [st.var for st in rest if st.kind == "load" and st.operand is not None
             and not graph.is_input(st.operand.value) and _zero_scalar(graph.node(st.operand.value))]
    sums = [st for st in rest if st.kind == "reduce" and st.op == "sum"]
    if not rest or rest[-1].kind != "store" or len(exprs) != 7 or len(zeros) > 1 or len(sums) != 1 \
            or len(rest) != 9 + len(zeros):
        return False

    def find(code):
        return next((v for v, c in exprs.items() if c == code), None)

    absm = find(f"tl.abs({m})")
    isinf = absm and find(f"({absm} == float('inf'))")
    shift = isinf and find(f"tl.where({isinf}, {zeros[0] if zeros else '0.0'}, {m})")
    diff = shift and find(f"({x} - {shift})")
    ex = diff and find(f"tl.exp({diff})")
    s = sums[0].var if ex and sums[0].deps == (ex,) else None
    log = s and find(f"tl.log({s})")
    out = log and (find(f"({log} + {shift})") or find(f"({shift} + {log})"))
    return bool(out) and rest[-1].deps == (out,)


def _zero_scalar(node) -> bool:
    return node.target == "aten.scalar_tensor.default" and node.args and node.args[0] == 0


def _normalization(stmts) -> str:
    """"softmax" or "log_softmax" when the statements from an online-softmax reduction on are
    exactly the lowering of torch.softmax / log_softmax of its input (templates/triton/
    gemm_rowreduce.py.j2 computes those itself); else Unsupported."""
    red, rest = stmts[0], stmts[1:]
    x, mx, s = red.deps[0], red.code, red.var
    exprs = {st.var: st.code for st in rest if st.kind == "expr"}
    stores = [st for st in rest if st.kind == "store"]
    if len(stores) != 1 or len(exprs) + 1 != len(rest):
        raise Unsupported("the group around its softmax is not a softmax or log-softmax of the GEMM's epilogue")
    shifted = next((v for v, c in exprs.items() if c == f"{x} - {mx}"), None)
    exps = next((v for v, c in exprs.items() if shifted and c == f"tl.exp({shifted})"), None)
    out = stores[0].deps[0]
    if exps and exprs.get(out) == f"{exps} / {s}" and len(exprs) == 3:
        return "softmax"
    logs = next((v for v, c in exprs.items() if c == f"tl.log({s})"), None)
    if shifted and logs and exprs.get(out) == f"{shifted} - {logs}" \
            and set(exprs) <= {shifted, exps, logs, out}:
        return "log_softmax"
    raise Unsupported("the group around its softmax is not a softmax or log-softmax of the GEMM's epilogue")


def _row_major(meta, numel: int) -> bool:
    """`meta` holds `numel` elements, contiguous (row-major): a free reshape to or from [M, N]."""
    expect, acc = [], 1
    for n in reversed(meta.shape):
        expect.append(acc)
        acc *= n
    return acc == numel and all(n == 1 or s == e for n, s, e in zip(meta.shape, meta.stride, reversed(expect)))


def render(fused: GemmEpilogue, config: dict, precision: str) -> tuple[str, list[str]]:
    """Module text whose `launch(*inputs)` runs the fused GEMM with `config`; and its inputs."""
    if fused.reduce:
        text = render_gemm_rowreduce(fused.epilogue, batched=False, name=f"{fused.group.id}_gemm",
                                     row_code=fused.row_code)
    else:
        text = render_gemm(fused.epilogue, batched=False, name=f"{fused.group.id}_gemm")
    ins = fused.inputs
    arg = {v: f"a{i}" for i, v in enumerate(ins)}
    kw = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages",
                                 "TMA", "KMAJOR", "PERSISTENT", "WARP_SPECIALIZE") if k in config}
    kw.update(precision_kwargs("bf16" if fused.cast_bf16 else precision))
    if fused.reduce in ("tile", "tile_row"):  # the code's view of the row (segments) is of exactly this tile
        kw["BLOCK_N"] = whole_row_block_n(fused.N)

    def operand(v):  # an operand of another rank, read row-major as [M, N] (a view when contiguous)
        return f"{arg[v]}.reshape({fused.M}, {fused.N})" if v in fused.flat else arg[v]

    call = ", ".join([arg[fused.a], arg[fused.b]] + [operand(v) for v in fused.operands]
                     + ([f"reduce={fused.reduce!r}"] if fused.reduce else [])
                     + [f"out_dtype=torch.{fused.out_dtype}"] + [f"{k}={v!r}" for k, v in kw.items()])
    prologue_doc = "" if not fused.prologue else (
        "; the bf16 operand casts (" + ", ".join(g.id for g in fused.prologue) + ") run on its tiles")
    wrapper = f'''

_gemm_launch = launch


def launch({", ".join(arg[v] for v in ins)}):
    """{fused.gemm.op} [{fused.M}x{fused.K}] @ [{fused.K}x{fused.N}] with group {fused.group.id} fused as its epilogue{prologue_doc}{f", then a {fused.reduce} over each row" if fused.reduce else ""}.

    Inputs: {", ".join(ins)}. Returns ({fused.group.outputs[0]},)."""
    return (_gemm_launch({call}){f".view({list(fused.out_shape)})" if fused.out_shape else ""},)
'''
    return text + wrapper, ins
