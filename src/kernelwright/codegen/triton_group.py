"""Lower a fusion group to one Triton kernel (plus its launcher) from templates/triton/group.py.j2.

The group's domain is collapsed to M kept indices x R reduced elements; every tensor operand is
addressed through its strides in domain coordinates (0 along broadcast dims), so broadcasting
operands, per-row and per-column parameters and non-contiguous inputs need no copies.
Composites (softmax, log-softmax, layer norm, mean, var, vector norms) are expanded into loads,
elementwise expressions and sum/max/min/argmax/argmin reductions. Reductions run in one pass when
a row fits in one tile (`one_pass`), otherwise each reduction is a loop over R that recomputes
the elementwise values it needs from global memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta
from kernelwright.capture.shapes import broadcast_strides, contiguous_strides, dense_permuted, refine_strides
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
from kernelwright.codegen.triton_ops import EXTRA_ARGS, OPERANDS, POINTWISE, format_float
from kernelwright.ops import EVAL_BN, FREE_VIEWS, layout_clone, reduction_spec, row_shapes
from kernelwright.plan.concat import placed_slot
from kernelwright.plan.fusion import Group



@dataclass(frozen=True)
class Reduction:
    """How one kind of row reduction is computed, in a tile that holds whole rows, in a loop over
    tiles and in a split over programs: `neutral`, the value lanes outside the row hold; `reduce`,
    the Triton reduction along a tile axis; `combine`, one loop step of an accumulator `{acc}` with
    the masked values `{x}`; `better`, for arg-reductions (which keep the value and its first index),
    the comparison by which a new value takes over."""

    neutral: str
    reduce: str
    combine: str = ""
    better: str = ""

    def masked(self, x: str, mask: str = "mask") -> str:
        return f"tl.where({mask}, {x}, {self.neutral})"

    def init(self, acc: str) -> str:
        return f"{acc} = tl.full([BLOCK_M, BLOCK_R], {self.neutral}, tl.float32)"

    def step(self, acc: str, x: str) -> str:
        return f"{acc} = " + self.combine.format(acc=acc, x=self.masked(x))

    def finalize(self, var: str, acc: str) -> str:
        return f"{var} = {self.reduce}({acc}, axis=1)[:, None]"


REDUCTIONS = {
    "sum": Reduction("0.0", "tl.sum", "{acc} + {x}"),
    "max": Reduction("float('-inf')", "tl.max", "tl.maximum({acc}, {x})"),
    "min": Reduction("float('inf')", "tl.min", "tl.minimum({acc}, {x})"),
    "argmax": Reduction("float('-inf')", "tl.max", better=">"),
    "argmin": Reduction("float('inf')", "tl.min", better="<"),
}


class Unsupported(Exception):
    """The group uses something this template cannot express; the library runs it instead."""


@dataclass
class Operand:
    param: str
    value: str  # graph value name
    strides: tuple[int, ...]  # per domain dim; 0 where broadcast
    level: str  # "full" | "row" | "scalar"
    dtype: str
    shape: tuple[int, ...] = ()


@dataclass
class Stmt:
    var: str
    level: str  # "full" | "row" | "scalar"
    kind: str  # "load" | "expr" | "reduce" | "store"
    code: str = ""
    deps: tuple[str, ...] = ()
    operand: Operand | None = None
    op: str = ""  # reduction kind


# The per-lane Welford update's 1 / count as one reciprocal per loop step. The loop walks r0 up
# from `start` in BLOCK_R steps and masks only r >= R (or rows >= M, whose delta is 0): a lane
# unmasked at step j was unmasked at every earlier step, so its count is j + 1 there, and a masked
# lane's delta is 0 whatever it is multiplied by. (A division per element made the statistics pass
# of a norm over bf16 data ALU-bound.)
WELFORD_STEP = "(1.0 / ((r0 - {start}) // BLOCK_R + 1))"


# ops the group template lowers to a Welford pass over their first argument
WELFORD_OPS = ("aten.var.correction", "aten.native_layer_norm.default", "aten.native_group_norm.default",
                "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_functional.default")


def welford_update(n: str, mean: str, m2: str, delta: str, x: str, start: str) -> list[str]:
    """One loop step of the per-lane Welford accumulators `n`, `mean`, `m2` ([BLOCK_M, BLOCK_R]
    tiles) over the masked values `x`, in a loop whose r0 starts at `start` (WELFORD_STEP)."""
    return [f"{n} = {n} + tl.where(mask, 1.0, 0.0)",
            f"{delta} = tl.where(mask, {x} - {mean}, 0.0)",
            f"{mean} = {mean} + {delta} * " + WELFORD_STEP.format(start=start),
            f"{m2} = {m2} + {delta} * tl.where(mask, {x} - {mean}, 0.0)"]


def written_stride(meta: TensorMeta, domain_rank: int) -> tuple[int, ...]:
    """The layout a group kernel writes an output in (and allocates it with): the recorded one
    (e.g. channels-last) for an output of the domain's rank whose layout is a dense permutation,
    or a broadcast of one (an expand the group ends with: stride 0 along the broadcast dims, as its
    readers were specialised for; every lane along them stores the same value), else contiguous."""
    if len(meta.shape) == domain_rank:
        kept = [(n, s) for n, s in zip(meta.shape, meta.stride) if s != 0 or n == 1]
        if dense_permuted([n for n, _ in kept], [s for _, s in kept]):
            return tuple(meta.stride)
    return contiguous_strides(meta.shape)


def output_stride(graph: Graph, name: str, domain_rank: int) -> tuple[int, ...]:
    """The strides a group kernel writes output `name` with: its concatenation buffer's where it
    lies in one (plan.concat), else written_stride's."""
    meta = graph.meta(name)
    return tuple(meta.stride) if placed_slot(graph, name) is not None else written_stride(meta, domain_rank)


class Lowering:
    """Builds the statement list and operands of one group."""

    def __init__(self, graph: Graph, group: Group):
        self.g, self.grp = graph, group
        self.D = tuple(group.domain)
        self.rd = tuple(group.rdims or ())
        self.stmts: list[Stmt] = []
        self.vars: dict[str, tuple[str, str]] = {}  # graph value -> (var, level)
        self.tuples: dict[str, list[tuple[str, str]]] = {}
        self.loads: dict[tuple, str] = {}
        self.inputs: list[Operand] = []
        self.outputs: list[Operand] = []
        self._welfords: dict[str, tuple[str, str]] = {}  # reduced value -> its (mean, m2)
        self.R = 1
        for d in self.rd:
            self.R *= self.D[d]
        self._n = 0

    # -- helpers -------------------------------------------------------------------------
    def _new(self, prefix="t") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def _emit(self, level, code, deps, prefix="t") -> str:
        var = self._new(prefix)
        self.stmts.append(Stmt(var, level, "expr", code, tuple(deps)))
        return var

    def _reduce(self, op, src) -> str:
        var = self._new("s")
        self.stmts.append(Stmt(var, "row", "reduce", deps=(src,), op=op))
        return var

    def _domain_strides(self, meta, ctx: str, shape: tuple | None = None) -> tuple[int, ...]:
        """Strides of a tensor broadcast into domain coordinates.

        ctx "full": broadcast (right-aligned) against `shape` — the shape of the op using it,
        by default the domain — then viewed as the domain when `shape` is a reshaping of it
        (e.g. [N, C, H, W] seen as group norm's [N, G, C/G, H*W]); "row": an operand in the
        keepdim form, or broadcast against `shape` where the using op has the keepdim row shape
        (a [C, 1, 1] scale times a [N, C, 1, 1] mean), else against the row shape without the
        reduced dims (keepdim=False form)."""
        nd = len(self.D)
        if ctx == "full" or len(meta.shape) == 0:
            target = tuple(shape) if shape is not None else self.D
            st = broadcast_strides(meta.shape, meta.stride, target)
            if st is None:
                raise Unsupported(f"operand of shape {tuple(meta.shape)} does not broadcast to {target}")
            if target != self.D:
                st = refine_strides(target, st, self.D)
                if st is None:
                    raise Unsupported(f"{target} is not a view of the domain {self.D}")
            return st
        if len(meta.shape) == nd and all(meta.shape[d] == 1 for d in self.rd):  # keepdim form
            st = broadcast_strides(meta.shape, meta.stride, row_shapes(self.D, self.rd)[0])
            if st is None:
                raise Unsupported(f"row operand of shape {tuple(meta.shape)} does not match the kept dims")
            return tuple(0 if j in self.rd else s for j, s in enumerate(st))
        if shape is not None and len(shape) == nd:  # an op of the keepdim row shape: broadcast against it
            st = broadcast_strides(meta.shape, meta.stride, tuple(shape))
            if st is not None:
                return tuple(0 if j in self.rd else s for j, s in enumerate(st))
        kept = [j for j in range(nd) if j not in self.rd]
        off = len(kept) - len(meta.shape)
        if off < 0:
            raise Unsupported("row operand has more dims than the kept dims")
        st = [0] * nd
        for pos, j in enumerate(kept):
            if pos >= off and meta.shape[pos - off] != 1:
                if meta.shape[pos - off] != self.D[j]:
                    raise Unsupported(f"row operand of shape {tuple(meta.shape)} does not match the kept dims")
                st[j] = meta.stride[pos - off]
        return tuple(st)

    def _level_of(self, strides) -> str:
        if all(s == 0 for s in strides):
            return "scalar"
        if all(strides[d] == 0 for d in self.rd):
            return "row"
        return "full"

    def operand(self, ref, ctx: str, shape: tuple | None = None, strides: tuple | None = None) -> tuple[str, str]:
        """(var, level) of a graph value or Python scalar used as an op argument (`shape`: the
        using op's shape; `strides`: explicit domain strides, e.g. per-channel parameters)."""
        if not isinstance(ref, Ref):
            if isinstance(ref, (int, float, bool)):
                return format_float(ref), "scalar"
            raise Unsupported(f"argument {ref!r} is not a tensor or number")
        if ref.name in self.vars:
            return self.vars[ref.name]
        meta = self.g.meta(ref.name)
        if meta is None:
            raise Unsupported(f"{ref.name} has no tensor metadata")
        if strides is None:
            strides = self._domain_strides(meta, ctx, shape)
        key = (ref.name, strides)
        if key not in self.loads:
            op = Operand(f"in{len(self.inputs)}", ref.name, strides, self._level_of(strides), meta.dtype, meta.shape)
            self.inputs.append(op)
            var = f"x{len(self.inputs) - 1}"
            self.stmts.append(Stmt(var, op.level, "load", operand=op))
            self.loads[key] = var
            return var, op.level
        var = self.loads[key]
        return var, next(s.level for s in self.stmts if s.var == var)

    # -- lowering ------------------------------------------------------------------------
    def lower(self):
        for name in self.grp.nodes:
            self._lower_node(self.g.node(name))
        for name in self.grp.outputs:
            var, level = self.vars[name]
            meta = self.g.meta(name)
            if tuple(meta.shape) == self.D and (level != "row" or self.grp.rdims is None or self.rd):
                level = "full" if level == "row" and tuple(meta.shape) != row_shapes(self.D, self.rd)[0] else level
            lay = TensorMeta(meta.shape, output_stride(self.g, name, len(self.D)), meta.dtype)
            if level == "full" or (self.grp.rdims is None and len(meta.shape) != len(self.D)):
                # a pointwise group's output may be any view of its domain (e.g. [B, T, C] of a
                # GEMM's [B*T, C] epilogue)
                strides = refine_strides(tuple(meta.shape), lay.stride, self.D)
                if strides is None:
                    raise Unsupported(f"output {name} shape {meta.shape} is not a view of the domain")
            else:
                strides = self._domain_strides(lay, "full" if len(meta.shape) == len(self.D) else "row")
            op = Operand(f"out{len(self.outputs)}", name, strides, level, meta.dtype, meta.shape)
            self.outputs.append(op)
            self.stmts.append(Stmt(var + "_st", level, "store", deps=(var,), operand=op))
        return self

    def _ctx(self, node: OpNode) -> str:
        shape = node.meta.shape if node.meta else ()
        if self.grp.rdims is not None and tuple(shape) in row_shapes(self.D, self.rd) and tuple(shape) != self.D:
            return "row"
        return "full"

    def _lower_node(self, n: OpNode):
        t = n.target
        if t == "getitem":
            self.vars[n.name] = self.tuples[n.args[0].name][n.args[1]]
            return
        if t in FREE_VIEWS or layout_clone(n):
            # a re-labelling (row values broadcast implicitly in the tiles), or a layout copy: the
            # value stored in the copy's strides
            self.vars[n.name] = self.vars[n.args[0].name]
            return
        if t in POINTWISE:
            self._lower_pointwise(n)
            return
        if t == EVAL_BN:  # (x - running_mean) * rsqrt(running_var + eps) [* w] [+ b], per channel
            x, _ = self.operand(n.args[0], "full")
            w, b, rm, rv, eps = n.args[1], n.args[2], n.args[3], n.args[4], float(n.args[6])
            mean, _ = self.operand(rm, "full", strides=self._per_channel(rm))
            var, _ = self.operand(rv, "full", strides=self._per_channel(rv))
            level = "full"
            y = self._emit(level, f"({x} - {mean}) * tl.rsqrt({var} + {format_float(eps)})", [x, mean, var])
            if w is not None:
                wv, _ = self.operand(w, "full", strides=self._per_channel(w))
                y = self._emit(level, f"{y} * {wv}", [y, wv])
            if b is not None:
                bv, _ = self.operand(b, "full", strides=self._per_channel(b))
                y = self._emit(level, f"{y} + {bv}", [y, bv])
            self.tuples[n.name] = [(y, level)]
            return
        spec = reduction_spec(n, self.g)
        if spec is None:
            raise Unsupported(f"{t} is not supported by the group template")
        x_meta = self.g.meta(n.args[0].name)
        x, lx = self.operand(n.args[0], "full", tuple(x_meta.shape))
        R = format_float(self.R)
        if t in ("aten.sum.default", "aten.sum.dim_IntList"):
            self.vars[n.name] = (self._reduce("sum", x), "row")
        elif t in ("aten.mean.default", "aten.mean.dim"):
            if self._deviations_of(n.args[0]):  # their one Welford pass over the data gives the mean too
                self.vars[n.name] = (self._welford(x)[0], "row")
            else:
                s = self._reduce("sum", x)
                self.vars[n.name] = (self._emit("row", f"{s} / {R}", [s]), "row")
        elif t == "aten.amax.default":
            self.vars[n.name] = (self._reduce("max", x), "row")
        elif t == "aten.amin.default":
            self.vars[n.name] = (self._reduce("min", x), "row")
        elif t in ("aten.argmax.default", "aten.argmin.default"):
            self.vars[n.name] = (self._reduce(t.split(".")[1], x), "row")
        elif t in ("aten.max.dim", "aten.min.dim"):
            kind = t.split(".")[1]
            self.tuples[n.name] = [(self._reduce(kind, x), "row"), (self._reduce("arg" + kind, x), "row")]
        elif t == "aten.var.correction":
            corr = n.kwargs.get("correction", 1)
            corr = 1.0 if corr is None else float(corr)
            _, m2 = self._welford(x)
            self.vars[n.name] = (self._emit("row", f"{m2} / {format_float(self.R - corr)}", [m2]), "row")
        elif t == "aten.linalg_vector_norm.default":
            order = float(n.args[1] if len(n.args) > 1 else n.kwargs.get("ord", 2))
            if order == 1.0:
                a = self._emit("full", f"tl.abs({x})", [x])
                self.vars[n.name] = (self._reduce("sum", a), "row")
            else:
                sq = self._emit("full", f"{x} * {x}", [x])
                s = self._reduce("sum", sq)
                self.vars[n.name] = (self._emit("row", f"tl.sqrt({s})", [s]), "row")
        elif t in ("aten._softmax.default", "aten._log_softmax.default"):
            # online softmax: one pass gives the row max and sum(exp(x - max)) together
            mx, s = self._new("s"), self._new("s")
            self.stmts.append(Stmt(s, "row", "reduce", code=mx, deps=(x,), op="online_softmax"))
            sh = self._emit("full", f"{x} - {mx}", [x, mx])
            e = self._emit("full", f"tl.exp({sh})", [sh])
            if t == "aten._softmax.default":
                self.vars[n.name] = (self._emit("full", f"{e} / {s}", [e, s]), "full")
            else:
                ls = self._emit("row", f"tl.log({s})", [s])
                self.vars[n.name] = (self._emit("full", f"{sh} - {ls}", [sh, ls]), "full")
        elif t == "aten.native_layer_norm.default":
            w, b, eps = n.args[2], n.args[3], float(n.args[4])
            self.tuples[n.name] = self._normalize(x, w, b, eps)
        elif t == "aten.native_group_norm.default":
            w, b, eps = n.args[1], n.args[2], float(n.args[7])
            cg = self.D[2]  # channels per group; weight/bias are per channel c = g * cg + j
            ch = lambda ref: None if ref is None else self.g.meta(ref.name).stride[0]  # noqa: E731
            ws = None if w is None else (0, cg * ch(w), ch(w), 0)
            bs = None if b is None else (0, cg * ch(b), ch(b), 0)
            self.tuples[n.name] = self._normalize(x, w, b, eps, ws, bs)
        elif t == "aten._native_batch_norm_legit.no_stats":
            w, b, eps = n.args[1], n.args[2], float(n.args[5])
            self.tuples[n.name] = self._normalize(x, w, b, eps, self._per_channel(w), self._per_channel(b))
        elif t == "aten._native_batch_norm_legit_functional.default":
            w, b, rm, rv, _, momentum, eps = n.args[1:8]
            outs = self._normalize(x, w, b, float(eps), self._per_channel(w), self._per_channel(b))
            mu, m2 = outs[1][0], self._last_m2
            mom = format_float(momentum)
            keep = format_float(1.0 - float(momentum))
            rmv, _ = self.operand(rm, "full", strides=self._per_channel(rm))
            rvv, _ = self.operand(rv, "full", strides=self._per_channel(rv))
            new_rm = self._emit("row", f"{keep} * {rmv} + {mom} * {mu}", [rmv, mu])
            unbiased = format_float(self.R - 1 if self.R > 1 else 1)
            new_rv = self._emit("row", f"{keep} * {rvv} + {mom} * ({m2} / {unbiased})", [rvv, m2])
            self.tuples[n.name] = outs + [(new_rm, "row"), (new_rv, "row")]
        else:
            raise Unsupported(f"{t} is not supported by the group template")

    def _welford(self, x: str) -> tuple[str, str]:
        """Row mean and sum of squared deviations of `x` in one pass over the data (one pass per
        value: a variance and a norm of the same values share it)."""
        if x not in self._welfords:
            mean, m2 = self._new("s"), self._new("s")
            self.stmts.append(Stmt(m2, "row", "reduce", code=mean, deps=(x,), op="welford"))
            self._welfords[x] = (mean, m2)
        return self._welfords[x]

    def _deviations_of(self, ref) -> bool:
        """Whether the group takes a variance or a normalization of the value `ref` (a Welford
        pass over it), so that a mean of the same value need not read the data again."""
        return isinstance(ref, Ref) and any(
            (m := self.g.node(name)).target in WELFORD_OPS and m.args and isinstance(m.args[0], Ref)
            and m.args[0].name == ref.name for name in self.grp.nodes)

    def _per_channel(self, ref) -> tuple | None:
        """Domain strides of a per-channel parameter ([C], channels = domain dim 1)."""
        if ref is None:
            return None
        return tuple(self.g.meta(ref.name).stride[0] if j == 1 else 0 for j in range(len(self.D)))

    def _normalize(self, x, w, b, eps, w_strides=None, b_strides=None) -> list[tuple[str, str]]:
        """(x - mean) * rstd [* w] [+ b] over the reduced dims: [(y, full), (mean, row), (rstd, row)]
        (the sum of squared deviations is left in self._last_m2)."""
        mu, m2 = self._welford(x)
        self._last_m2 = m2
        rstd = self._emit("row", f"tl.rsqrt({m2} / {format_float(self.R)} + {format_float(eps)})", [m2])
        d = self._emit("full", f"{x} - {mu}", [x, mu])
        y = self._emit("full", f"{d} * {rstd}", [d, rstd])
        if w is not None:
            wv, _ = self.operand(w, "full", strides=w_strides)
            y = self._emit("full", f"{y} * {wv}", [y, wv])
        if b is not None:
            bv, _ = self.operand(b, "full", strides=b_strides)
            y = self._emit("full", f"{y} + {bv}", [y, bv])
        return [(y, "full"), (mu, "row"), (rstd, "row")]

    def _lower_pointwise(self, n: OpNode):
        t = n.target
        k = OPERANDS.get(t, len(n.args))
        ctx = self._ctx(n)
        args, deps, levels = [], [], []
        shape = tuple(n.meta.shape) if n.meta is not None else None
        for a in n.args[:k]:
            var, level = self.operand(a, ctx, shape)
            args.append(var)
            levels.append(level)
            if isinstance(a, Ref):
                deps.append(var)
        kw = dict(zip(EXTRA_ARGS.get(t, []), n.args[k:]))
        kw.update(n.kwargs)
        code = POINTWISE[t](args, kw)
        level = "full" if "full" in levels else ("row" if "row" in levels else "scalar")
        if level == "scalar":
            level = "row" if self.grp.rdims is not None else "full"
        self.vars[n.name] = (self._emit(level, code, deps), level)


# -- rendering ---------------------------------------------------------------------------

def _collapse(D, rd, vectors, ref: int | None = None, fixed_red: bool = False):
    """Drop size-1 dims and merge neighbours that every operand walks contiguously.

    With `ref` (an index into `vectors`), the kept dims, and unless `fixed_red` the reduced dims,
    are first put in the order of that operand's memory (largest stride outermost), so a
    channels-last operand is walked along its contiguous channels instead of across them.
    Returns (kept, reduced): lists of (size, [stride per operand])."""
    dims = [j for j in range(len(D)) if D[j] != 1]
    if ref is not None:
        key = lambda j: -abs(vectors[ref][j])  # noqa: E731 - stable: equal strides keep domain order
        kept_dims = sorted((j for j in dims if j not in rd), key=key)
        red_dims = [j for j in dims if j in rd]
        dims = kept_dims + (red_dims if fixed_red else sorted(red_dims, key=key))
    merged: list[tuple[int, list[int], bool]] = []
    for j in dims:
        red = j in rd
        sts = [v[j] for v in vectors]
        if merged:
            size, prev, pred = merged[-1]
            if pred == red and all(p == s * D[j] for p, s in zip(prev, sts)):
                merged[-1] = (size * D[j], sts, red)
                continue
        merged.append((D[j], sts, red))
    kept = [(s, st) for s, st, r in merged if not r]
    red = [(s, st) for s, st, r in merged if r]
    return kept, red


def _index_lines(prefix, var, dims, operands, used):
    """Lines computing each used operand's offset along index `var` (mixed radix over `dims`).

    Returns (lines, {param: offset expression, or None for an operand that does not move})."""
    sizes = [s for s, _ in dims]
    divs = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    coords: set[int] = set()
    offs: dict[str, str | None] = {}
    for k, op in enumerate(operands):
        if op.param not in used:
            continue
        sts = [st[k] for _, st in dims]
        if not any(sts):
            offs[op.param] = None
        elif all(s == d * sts[-1] for s, d in zip(sts, divs)):  # walks the dims contiguously: one multiply
            offs[op.param] = var if sts[-1] == 1 else f"{var} * {sts[-1]}"
        else:
            coords.update(i for i, s in enumerate(sts) if s)
            offs[op.param] = " + ".join(f"{prefix}c{i}" + ("" if s == 1 else f" * {s}") for i, s in enumerate(sts) if s)
    lines = []
    for i in sorted(coords):
        if len(sizes) == 1:
            expr = var
        elif i == 0:
            expr = f"{var} // {divs[0]}"
        elif i == len(sizes) - 1:
            expr = f"{var} % {sizes[i]}"
        else:
            expr = f"({var} // {divs[i]}) % {sizes[i]}"
        lines.append(f"{prefix}c{i} = {expr}")
    lines += [f"o{prefix}_{p} = {e}" for p, e in offs.items() if e is not None]
    return lines, offs


@dataclass
class GroupKernel:
    """A rendered group kernel: module source text plus what the caller needs to know."""

    source: str
    config: dict
    inputs: list[str]  # graph values passed to launch(), in order
    outputs: list[str]  # graph values launch() returns, in order
    M: int
    R: int
    bytes: int  # minimum bytes the kernel moves


def lower(graph: Graph, group: Group) -> Lowering:
    return Lowering(graph, group).lower()


def _layout(low: Lowering):
    """(kept, reduced) dims of a lowered group in the walk order of its memory: a pointwise group
    is ordered like its first domain-sized output, a reduction group (which reads its input in
    every pass but writes once) like its first domain-sized input, else whichever exists; reduced
    dims keep the domain order when an argmax/argmin must report flat indices in it."""
    ops = low.inputs + low.outputs
    dense = [k for k, o in enumerate(ops) if o.level != "scalar" and (low.rd == () or o.level == "full")
             and all(o.strides[j] for j in range(len(low.D)) if low.D[j] != 1)]
    outs = [k for k in dense if k >= len(low.inputs)]
    ins = [k for k in dense if k < len(low.inputs)]
    order = ins + outs if low.rd else outs + ins
    ref = order[0] if order else None  # never a broadcast operand
    fixed = any(s.kind == "reduce" and s.op in ("argmax", "argmin") for s in low.stmts)
    return _collapse(low.D, low.rd, [o.strides for o in ops], ref, fixed)


def transposed_walk(low: Lowering):
    """For a pointwise group whose operands disagree on the innermost dim (a channels-last input
    written to an NCHW output, say): (outer dims, Q dim, P dim) of the collapsed domain, with P the
    output's contiguous dim and Q the input's, each as (size, [stride per operand]); else None.
    Such a group can walk [BLOCK_Q, BLOCK_P] tiles so both sides are read / written coalesced."""
    if low.rd:
        return None
    kept, _ = _layout(low)
    if len(kept) < 2:
        return None
    ops = low.inputs + low.outputs
    for k, op in enumerate(ops):
        if op.level == "scalar" or k >= len(low.inputs):
            continue
        unit = [j for j, (_, st) in enumerate(kept) if abs(st[k]) == 1]
        if unit and unit[0] != len(kept) - 1 and all(st[k] for _, st in kept):
            q = unit[0]
            outer = [d for j, d in enumerate(kept) if j not in (q, len(kept) - 1)]
            return outer, kept[q], kept[-1]
    return None


def inner_rows(low: Lowering) -> tuple[list, tuple] | None:
    """For a reduction group with at least two kept dims whose domain-sized output has unit stride
    along the last of them (a softmax over the channels of a channels-last tensor, written NCHW:
    the pixels of one image are that output's contiguous dim): (outer dims, that dim), each as
    (size, [stride per operand]); else None. Rows walked in blocks of that dim per outer index
    (config INNER) make each tile one run of the output (a tile never crosses an image), which the
    compiler sees in the output's offsets: it stores along the pixels, BLOCK_M of them per channel
    plane (in the sm_90 TTGIR of KernelBench 91's softmax group: 32 threads of a warp along the
    pixels with 32 or 64 rows, 16 in the row schedule's 16-row tiles)."""
    if not low.rd:
        return None
    kept, _ = _layout(low)
    if len(kept) < 2:
        return None
    n_in = len(low.inputs)
    last = kept[-1][1]
    if any(o.level == "full" and abs(last[n_in + i]) == 1 for i, o in enumerate(low.outputs)):
        return kept[:-1], kept[-1]
    return None


def tiled_apply_dims(low: Lowering) -> tuple[int, int] | None:
    """(Q, P) for the split schedule's tiled apply pass: when the reduced dims collapse to two,
    [Q, P] in the main input's memory order (P innermost), and a domain-shaped output is not
    contiguous along P (a group norm over channels-last data written NCHW: P = channels of a group,
    Q = pixels), the pass walks [BLOCK_Q, P] tiles, reading rows of P and writing runs of Q."""
    if not any(st.kind == "store" and st.operand.level == "full" for st in low.stmts):
        return None
    _, red = _layout(low)
    if len(red) != 2:
        return None
    ops = low.inputs + low.outputs
    for op in low.outputs:
        k = ops.index(op)
        if op.level == "full" and red[1][1][k] != 1 and red[0][1][k] == 1:
            return red[0][0], red[1][0]
    return None


def extent(low: Lowering) -> tuple[int, int, bool]:
    """(M kept indices, R reduced elements per row, whether the main input is contiguous along
    the reduction: its innermost reduced dim has stride 1 and, in a longer row, at least 16
    elements, so one row alone fills cache lines) of a lowered group, after collapsing mergeable
    dims. A group norm over channels-last data (8 channels per group between pixel jumps) is not."""
    ops = low.inputs + low.outputs
    kept, red = _layout(low)
    M = math.prod(s for s, _ in kept) if kept else 1
    R = math.prod(s for s, _ in red) if red else 1
    main = low.inputs[0] if low.inputs else None
    if not red or main is None:
        return M, R, True
    size, strides = red[-1]
    return M, R, strides[ops.index(main)] == 1 and (size >= 16 or len(red) == 1)


def reduce_tile_lines(s: Stmt, R: int, *, mask: str = "mask", axis: int = 1, index: str = "r") -> list[str]:
    """Lines computing reduction statement `s` over a tile that holds whole rows of R elements
    along `axis` (the last axis of a 2-D [BLOCK_M, BLOCK_R] or 3-D tile), the result kept with that
    axis as size 1; `mask` marks the lanes in bounds, `index` is the lanes' position along the
    reduced axis (arg-reductions only)."""
    src = s.deps[0]
    keep = "[:, None]" if axis == 1 else "[:, :, None]"
    if s.op == "welford":
        return [f"{s.code} = tl.sum(tl.where({mask}, {src}, 0.0), axis={axis}){keep} / {R}",
                f"{s.var} = tl.sum(tl.where({mask}, ({src} - {s.code}) * ({src} - {s.code}), 0.0), axis={axis}){keep}"]
    if s.op == "online_softmax":
        return [f"{s.code} = tl.max(tl.where({mask}, {src}, float('-inf')), axis={axis}){keep}",
                f"{s.var} = tl.sum(tl.where({mask}, tl.exp({src} - {s.code}), 0.0), axis={axis}){keep}"]
    red = REDUCTIONS[s.op]
    if not red.better:
        return [f"{s.var} = {red.reduce}({red.masked(src, mask)}, axis={axis}){keep}"]
    return [f"{s.var}_v = {red.reduce}({red.masked(src, mask)}, axis={axis}){keep}",
            f"{s.var} = tl.min(tl.where({mask} & ({src} == {s.var}_v), {index}, {R}), axis={axis}){keep}"]


def render_group(graph: Graph, group: Group, config: dict, low: Lowering | None = None) -> GroupKernel:
    low = low or lower(graph, group)
    ops = low.inputs + low.outputs
    kept, red = _layout(low)
    M = math.prod(s for s, _ in kept)
    R = math.prod(s for s, _ in red)
    pointwise = group.rdims is None
    one_pass = bool(config.get("one_pass", True)) and not pointwise
    BLOCK_M, BLOCK_R = int(config["BLOCK_M"]), int(config.get("BLOCK_R", 1))
    if one_pass and BLOCK_R < R:
        raise Unsupported("one_pass needs BLOCK_R >= R")
    used_m = {o.param for o in ops if o.level != "scalar"}
    used_r = {o.param for o in ops if o.level == "full"}
    tiled = None
    if pointwise and config.get("TILED"):
        tiled = transposed_walk(low)
        if tiled is None:
            raise Unsupported("a tiled walk needs operands that disagree on the innermost dim")
    inner = None
    if config.get("INNER"):
        inner = inner_rows(low)
        if inner is None or pointwise or int(config.get("SPLIT", 1)) > 1:
            raise Unsupported("rows walked along the inner dim need a row schedule and an output contiguous along it")
    if tiled is not None:
        kept_lines, m_off = _tiled_index_lines(tiled, ops, used_m)
    elif inner is not None:
        kept_lines, m_off = _inner_index_lines(inner, ops, used_m)
    else:
        kept_lines, m_off = _index_lines("m", "m", kept, ops, used_m) if kept else ([], {p: None for p in used_m})
    red_lines, r_off = _index_lines("r", "r", red, ops, used_r) if red else ([], {p: None for p in used_r})

    out_params = {o.param for o in low.outputs}

    def addr(op: Operand) -> str:
        # an output with no offset along m (one row in all) still needs a block of pointers
        zero_m = "0 * m" if op.param in out_params else None
        parts = [f"om_{op.param}" if m_off.get(op.param) else zero_m]
        if op.level == "full" and not pointwise:
            parts.append(f"or_{op.param}" if r_off.get(op.param) else None)
        parts = [p for p in parts if p]
        return op.param + (" + " + " + ".join(parts) if parts else "")

    evict = bool(config.get("EVICT", False)) and not pointwise and not one_pass

    def render(s: Stmt, last_read: bool = True) -> list[str]:
        """Lines for one load, expression or store (the same text in a tile, a loop or at top level).
        With EVICT, a domain-sized load is marked evict_first where it is the last read of the
        data and evict_last where a later pass reads it again (a row kept in L2 between the
        passes); operands broadcast along the rows (weights) are always evict_last."""
        if s.kind == "load":
            op = s.operand
            cast = "" if op.dtype == "bool" else ".to(tl.float32)"
            if op.level == "scalar" or addr(op) == op.param:
                # (also an operand whose offsets all vanish: one element for the whole domain, as a
                # batch norm's statistics and weights over a single channel)
                return [f"{s.var} = tl.load({op.param}){cast}"]
            msk = "mask" if op.level == "full" else "mmask"
            hint = ""
            if evict and op.level == "full":
                reused = last_read is False or not m_off.get(op.param)
                hint = f", eviction_policy='{'evict_last' if reused else 'evict_first'}'"
            return [f"{s.var} = tl.load({addr(op)}, mask={msk}, other=0{hint}){cast}"]
        if s.kind == "expr":
            return [f"{s.var} = {s.code}"]
        if s.kind == "store":
            op = s.operand
            msk = "mask" if op.level == "full" else "mmask"
            val = s.deps[0]
            if op.dtype == "bfloat16":  # (rounded to nearest even in the interpreter too: kw_cast_out)
                val = f"kw_cast_out({val}, {op.param})"
            return [f"tl.store({addr(op)}, {val}, mask={msk})"]
        raise AssertionError(s.kind)

    body: list[str] = []
    phases: list[dict] = []
    by_var = {s.var: s for s in low.stmts}
    split = int(config.get("SPLIT", 1))
    if split > 1:
        return _render_split(graph, group, low, config, split, M, R, kept_lines, red_lines, render, by_var)
    if pointwise or one_pass:
        for s in low.stmts:
            body += reduce_tile_lines(s, R) if s.kind == "reduce" else render(s)
    else:
        def closure(roots) -> list[Stmt]:
            return _closure(low, by_var, roots)

        pre: list[str] = []
        n_reduce = sum(1 for s in low.stmts if s.kind == "reduce")
        writes_full = any(s.kind == "store" and s.operand.level == "full" for s in low.stmts)
        k_reduce = 0
        for s in low.stmts:
            if s.kind == "reduce":
                src = s.deps[0]
                k_reduce += 1
                again = writes_full or k_reduce < n_reduce  # a later pass reads the rows again
                lines = [ln for st in closure([src]) for ln in render(st, last_read=not again)]
                if s.op == "welford":
                    # per-lane running count, mean and M2; lanes merged with Chan's formula after the loop
                    init = ["acc_n = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)",
                            "acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)",
                            "acc_m2 = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)"]
                    lines += welford_update("acc_n", "acc", "acc_m2", "delta", src, start="0")
                    post = [f"{s.code} = tl.sum(acc * acc_n, axis=1)[:, None] / {R}",
                            f"{s.var} = tl.sum(acc_m2 + acc_n * (acc - {s.code}) * (acc - {s.code}), axis=1)[:, None]"]
                elif s.op == "online_softmax":
                    init = ["acc = tl.full([BLOCK_M, BLOCK_R], float('-inf'), tl.float32)",
                            "acc_s = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)"]
                    lines += [f"cand = tl.where(mask, {src}, float('-inf'))",
                              "m_new = tl.maximum(acc, cand)",
                              "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
                              "acc_s = acc_s * tl.exp(acc - m_safe) + tl.where(mask, tl.exp(cand - m_safe), 0.0)",
                              "acc = m_new"]
                    post = [f"{s.code} = tl.max(acc, axis=1)[:, None]",
                            f"{s.var} = tl.sum(acc_s * tl.exp(acc - tl.where({s.code} == float('-inf'), 0.0, {s.code})), axis=1)[:, None]"]
                elif not REDUCTIONS[s.op].better:
                    red = REDUCTIONS[s.op]
                    init = [red.init("acc")]
                    lines.append(red.step("acc", src))
                    post = [red.finalize(s.var, "acc")]
                else:
                    red = REDUCTIONS[s.op]
                    init = [red.init("acc"), "acc_i = tl.zeros([BLOCK_M, BLOCK_R], tl.int64)"]
                    lines += [f"cand = {red.masked(src)}",
                              f"take = cand {red.better} acc",
                              "acc_i = tl.where(take, r + tl.zeros([BLOCK_M, BLOCK_R], tl.int64), acc_i)",
                              "acc = tl.where(take, cand, acc)"]
                    post = [red.finalize(f"{s.var}_v", "acc"),
                            f"{s.var} = tl.min(tl.where(acc == {s.var}_v, acc_i, {R}), axis=1)[:, None]"]
                phases.append({"pre": pre + init, "body": lines, "post": post})
                pre = []
            elif s.level in ("row", "scalar") and s.kind in ("load", "expr"):
                pre += render(s)
        full_stores = [s for s in low.stmts if s.kind == "store" and s.operand.level == "full"]
        row_stores = [s for s in low.stmts if s.kind == "store" and s.operand.level != "full"]
        if full_stores:
            lines = [ln for st in closure([s.deps[0] for s in full_stores]) for ln in render(st)]
            for s in full_stores:
                lines += render(s)
            phases.append({"pre": pre, "body": lines, "post": []})
            pre = []
        post = [ln for s in row_stores for ln in render(s)]
        phases.append({"pre": pre, "body": [], "post": post})

    extra = dict(pointwise=pointwise, one_pass=one_pass, index_m=kept_lines, index_r=red_lines, body=body,
                 phases=phases, BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R, int64=needs_int64(low, M + BLOCK_M, R + BLOCK_R),
                 tiled=tiled is not None, inner=False)
    if inner is not None:
        P = inner[1][0]
        extra.update(inner=True, P=P, NB=-(-P // BLOCK_M), O=math.prod(size for size, _ in inner[0]))
    if tiled is not None:
        outer, (Q, _), (P, _) = tiled
        O = math.prod(size for size, _ in outer)
        BQ, BP = int(config["BLOCK_Q"]), int(config["BLOCK_P"])
        if O > 65535 or -(-Q // BQ) > 65535:
            raise Unsupported("tiled walk: grid dims 1 and 2 are limited to 65535 programs")
        extra.update(Q=Q, P=P, O=O, BLOCK_Q=BQ, BLOCK_P=BP)
    return _finish_render("group.py.j2", graph, group, low, config, M, R, extra)


def _tiled_index_lines(tiled, operands, used):
    """Offsets of every used operand for a [BLOCK_Q, BLOCK_P] tile at outer index `o`: the outer
    dims through _index_lines, plus the q and p terms."""
    outer, (_, q_st), (_, p_st) = tiled
    lines, offs = _index_lines("m", "o", outer, operands, used) if outer else ([], {p: None for p in used})
    for k, op in enumerate(operands):
        if op.param not in used:
            continue
        terms = [f"om_{op.param}"] if offs[op.param] else []
        terms += [f"q * {q_st[k]}" if q_st[k] != 1 else "q"] if q_st[k] else []
        terms += [f"p * {p_st[k]}" if p_st[k] != 1 else "p"] if p_st[k] else []
        if terms and terms != [f"om_{op.param}"]:
            lines.append(f"om_{op.param} = {' + '.join(terms)}")
            offs[op.param] = f"om_{op.param}"
    return lines, offs


def _inner_index_lines(inner, operands, used):
    """Offsets of every used operand for rows p of outer index `po` (the INNER walk): the outer dims
    through _index_lines, plus the p term."""
    outer, (_, p_st) = inner
    lines, offs = _index_lines("mo", "po", outer, operands, used)
    for k, op in enumerate(operands):
        if op.param not in used:
            continue
        terms = [f"omo_{op.param}"] if offs[op.param] else []
        terms += [f"p * {p_st[k]}" if p_st[k] != 1 else "p"] if p_st[k] else []
        offs[op.param] = " + ".join(terms) or None
        if offs[op.param]:
            lines.append(f"om_{op.param} = {offs[op.param]}")
    return lines, offs


def needs_int64(low: "Lowering", m_end: int, r_end: int) -> bool:
    """Whether an index or an element offset of some operand can reach 2**31 (else the kernel
    computes addresses in int32, as compiled reductions do: fewer registers and instructions)."""
    limit = 2**31 - 1
    far = max((sum((d - 1) * abs(s) for d, s in zip(low.D, o.strides)) for o in low.inputs + low.outputs), default=0)
    return far >= limit or m_end >= limit or r_end >= limit


def _closure(low: "Lowering", by_var: dict, roots) -> list[Stmt]:
    """The full-level loads and expressions the given values need, in program order."""
    need, stack = set(), list(roots)
    while stack:
        v = stack.pop()
        st = by_var.get(v)
        if st is None or st.level != "full" or v in need:
            continue
        need.add(v)
        stack.extend(st.deps)
    return [st for st in low.stmts if st.var in need and st.kind in ("load", "expr")]


def _render_split(graph, group, low, config, split, M, R, kept_lines, red_lines, render, by_var):
    """Split reductions for few, long rows: (1) per-(row block, split) partial statistics,
    (2) combine them and compute every per-row value, (3) if the group writes domain-shaped
    outputs, an elementwise pass that reads the per-row values back from small buffers."""
    reduces = [s for s in low.stmts if s.kind == "reduce"]
    if not reduces or any(s.op not in ("welford", "online_softmax") and not (s.op in REDUCTIONS and REDUCTIONS[s.op].combine)
                          for s in reduces):
        raise Unsupported("split reduction needs sum/max/min/Welford/online-softmax reductions only")
    closures = {s.var: _closure(low, by_var, [s.deps[0]]) for s in reduces}
    for s in reduces:
        for st in closures[s.var]:
            if any(by_var.get(d) is not None and by_var[d].level != "full" and by_var[d].kind != "load"
                   for d in st.deps):
                raise Unsupported("a reduction depends on another row value; cannot split it")
    BLOCK_M, BLOCK_R = int(config["BLOCK_M"]), int(config["BLOCK_R"])
    chunk = -(-(-(-R // split)) // BLOCK_R) * BLOCK_R
    plane = M * split  # elements of one partial statistic
    needed = list(dict.fromkeys(st.var for s in reduces for st in closures[s.var]))
    body = [ln for v in needed for ln in render(by_var[v])]
    # row and scalar operands the reduced values read (a scalar constant, a per-row weight) are
    # loaded once before the loop of the partial kernel
    side_vars = {d for v in needed for d in by_var[v].deps}
    side_loads = [st for st in low.stmts if st.kind == "load" and st.level != "full" and st.var in side_vars]
    pre_a = [ln for st in side_loads for ln in render(st)]
    init, post_a, finish, parts, part_docs, allocs = [], [], [], [], [], []
    for k, s in enumerate(reduces):
        src, part = s.deps[0], f"part{k}"
        parts.append(part)
        at = f"{part} + m * {split} + split"
        if s.op == "welford":
            part_docs.append(f"partial count, mean and M2 per (row, split): [3, {M}, {split}]")
            allocs.append(f"{part} = _scratch('{part}', (3, {M}, {split}), out0.device)")
            init += [f"n{k} = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)", f"mu{k} = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)",
                     f"q{k} = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)"]
            body += welford_update(f"n{k}", f"mu{k}", f"q{k}", f"d{k}", src, start=f"split * {chunk}")
            post_a += [f"rn{k} = tl.sum(n{k}, axis=1)[:, None]",
                       f"rmu{k} = tl.sum(mu{k} * n{k}, axis=1)[:, None] / tl.maximum(rn{k}, 1.0)",
                       f"rq{k} = tl.sum(q{k} + n{k} * (mu{k} - rmu{k}) * (mu{k} - rmu{k}), axis=1)[:, None]",
                       f"tl.store({at}, rn{k}, mask=mmask)", f"tl.store({at} + {plane}, rmu{k}, mask=mmask)",
                       f"tl.store({at} + {2 * plane}, rq{k}, mask=mmask)"]
            src_at = f"{part} + m * {split} + s"
            finish += [f"pn{k} = tl.load({src_at}, mask=smask, other=0.0)",
                       f"pm{k} = tl.load({src_at} + {plane}, mask=smask, other=0.0)",
                       f"pq{k} = tl.load({src_at} + {2 * plane}, mask=smask, other=0.0)",
                       f"{s.code} = tl.sum(pn{k} * pm{k}, axis=1)[:, None] / {format_float(R)}",
                       f"{s.var} = tl.sum(pq{k} + pn{k} * (pm{k} - {s.code}) * (pm{k} - {s.code}), axis=1)[:, None]"]
        elif s.op == "online_softmax":
            # per (row, split): the chunk's max and sum(exp(x - max)); rescaled to the row's max when combined
            part_docs.append(f"partial max and sum of exp(x - max) per (row, split): [2, {M}, {split}]")
            allocs.append(f"{part} = _scratch('{part}', (2, {M}, {split}), out0.device)")
            init += [f"mx{k} = tl.full([BLOCK_M, BLOCK_R], float('-inf'), tl.float32)",
                     f"se{k} = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)"]
            body += [f"cand{k} = tl.where(mask, {src}, float('-inf'))",
                     f"mn{k} = tl.maximum(mx{k}, cand{k})",
                     f"ms{k} = tl.where(mn{k} == float('-inf'), 0.0, mn{k})",
                     f"se{k} = se{k} * tl.exp(mx{k} - ms{k}) + tl.where(mask, tl.exp(cand{k} - ms{k}), 0.0)",
                     f"mx{k} = mn{k}"]
            post_a += [f"rm{k} = tl.max(mx{k}, axis=1)[:, None]",
                       f"rs{k} = tl.sum(se{k} * tl.exp(mx{k} - tl.where(rm{k} == float('-inf'), 0.0, rm{k})), axis=1)[:, None]",
                       f"tl.store({at}, rm{k}, mask=mmask)", f"tl.store({at} + {plane}, rs{k}, mask=mmask)"]
            src_at = f"{part} + m * {split} + s"
            finish += [f"pm{k} = tl.load({src_at}, mask=smask, other=float('-inf'))",
                       f"ps{k} = tl.load({src_at} + {plane}, mask=smask, other=0.0)",
                       f"{s.code} = tl.max(pm{k}, axis=1)[:, None]",
                       f"{s.var} = tl.sum(ps{k} * tl.exp(pm{k} - tl.where({s.code} == float('-inf'), 0.0, {s.code})), "
                       "axis=1)[:, None]"]
        else:
            red = REDUCTIONS[s.op]
            part_docs.append(f"partial {s.op} per (row, split): [{M}, {split}]")
            allocs.append(f"{part} = _scratch('{part}', ({M}, {split}), out0.device)")
            init.append(red.init(f"acc{k}"))
            body.append(red.step(f"acc{k}", src))
            post_a.append(f"tl.store({at}, {red.reduce}(acc{k}, axis=1)[:, None], mask=mmask)")
            finish.append(f"{s.var} = {red.reduce}(tl.load({part} + m * {split} + s, mask=smask, "
                          f"other={red.neutral}), axis=1)[:, None]")
    for st in low.stmts:
        if st.kind in ("load", "expr") and st.level != "full":
            finish += render(st)
    row_stores = [st for st in low.stmts if st.kind == "store" and st.operand.level != "full"]
    full_stores = [st for st in low.stmts if st.kind == "store" and st.operand.level == "full"]
    for st in row_stores:
        finish += render(st)
    side_params = {st.operand.param for st in side_loads}
    full_loads = [op for op in low.inputs if op.level == "full" or op.param in side_params]
    row_loads = [op for op in low.inputs if op.level != "full"]
    apply, bufs, buf_docs = [], [], []
    if full_stores:
        need = _closure(low, by_var, [st.deps[0] for st in full_stores])
        # per-row values: row-level statements, plus the second result (mean / max) of Welford and
        # online-softmax reductions, which is named in the statement's `code`
        row_defs = {st.var for st in low.stmts if st.level != "full"}
        row_defs |= {st.code for st in reduces if st.op in ("welford", "online_softmax")}
        row_vals = list(dict.fromkeys(d for st in need for d in st.deps if d in row_defs))
        for j, v in enumerate(row_vals):
            if v in by_var and by_var[v].kind == "load":  # parameters are cheap to load again
                apply += render(by_var[v])
                continue
            bufs.append(f"rb{j}")
            buf_docs.append(f"per-row value {v}: [{M}]")
            allocs.append(f"rb{j} = _scratch('rb{j}', ({M},), out0.device)")
            finish.append(f"tl.store(rb{j} + m, {v}, mask=mmask)")
            apply.append(f"{v} = tl.load(rb{j} + m, mask=mmask, other=0.0)")
        for st in need:
            apply += render(st)
        for st in full_stores:
            apply += render(st)
    # row values that also feed other row values but come from reductions are available in
    # `finish`; a per-row value needed by the apply pass is re-read from its buffer.
    apply_index, apply_block, apply_tiles = [], BLOCK_R, f"_cdiv({R}, {BLOCK_R})"
    # APPLY_REVERSE: the apply pass walks its tiles last to first, starting on the elements the
    # partial pass read last (its programs run in the same row-fastest order), which may still be in L2
    apply_tile = "(tl.num_programs(1) - 1 - tl.program_id(1))" if config.get("APPLY_REVERSE") else "tl.program_id(1)"
    if config.get("TILED_APPLY"):
        dims = tiled_apply_dims(low)
        if dims is None or not apply:
            raise Unsupported("a tiled apply pass needs two reduced dims an output walks in the other order")
        Q, P = dims
        P2 = 1 << (P - 1).bit_length()
        # the tile is [APPLY_Q pixels, BLOCK_M * P channels] (APPLY_Q: BLOCK_R // P unless set): a
        # taller tile writes longer runs of an NCHW output, independently of the partial pass's tile
        apply_block = int(config.get("APPLY_Q") or max(1, BLOCK_R // P2))
        apply_tiles = f"_cdiv({Q}, {apply_block})"
        _, red = _layout(low)
        q_line = f"q = {apply_tile}.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]"
        if BLOCK_M == 1:
            apply_index = [q_line, f"p = tl.arange(0, {P2})[None, :]"]
        else:  # BLOCK_M rows side by side along the tile's columns: neighbouring groups' channels
            W = BLOCK_M * P2
            apply_index = [f"m = tl.program_id(0).to(tl.int64) * BLOCK_M + (tl.arange(0, {W}) // {P2})[None, :]",
                           f"mmask = m < {M}", q_line, f"p = (tl.arange(0, {W}) % {P2})[None, :]"]
        apply_index.append(f"mask = mmask & (q < {Q}) & (p < {P})")
        ops = low.inputs + low.outputs
        for k, op in enumerate(ops):
            if op.level != "full":
                continue
            terms = [t if st == 1 else f"{t} * {st}" for t, st in (("q", red[0][1][k]), ("p", red[1][1][k])) if st]
            if terms:
                apply_index.append(f"or_{op.param} = " + " + ".join(terms))
    extra = dict(
        apply_index=apply_index, apply_block=apply_block, apply_tiles=apply_tiles, apply_tile=apply_tile,
        SPLIT=split, CHUNK=chunk, SPLIT_P2=1 << (split - 1).bit_length(), index_m=kept_lines, index_r=red_lines,
        init=pre_a + init, body=body, post_a=post_a, finish=finish, apply=apply, BLOCK_M=BLOCK_M, BLOCK_R=BLOCK_R,
        params_a=[op.param for op in full_loads] + parts,
        doc_a=[f"input {op.value}: {op.dtype}{list(op.shape)}, domain strides {list(op.strides)} ({op.level})"
               for op in full_loads]
        + part_docs,
        params_b=parts + [op.param for op in row_loads] + [op.param for op in low.outputs] + bufs,
        doc_b=part_docs + [f"input {op.value}: {op.dtype}{list(op.shape)} ({op.level})" for op in row_loads]
        + [f"output {op.value}: {op.dtype}{list(op.shape)}" for op in low.outputs] + buf_docs,
        params_c=[op.param for op in low.inputs] + bufs + [op.param for op in low.outputs],
        doc_c=[f"input {op.value}: {op.dtype}{list(op.shape)} ({op.level})" for op in low.inputs] + buf_docs
        + [f"output {op.value}: {op.dtype}{list(op.shape)}" for op in low.outputs],
        partial_allocs=allocs, full_loads=full_loads, row_loads=row_loads, parts=parts, bufs=bufs)
    return _finish_render("group_split.py.j2", graph, group, low, config, M, R, extra)


def _finish_render(template, graph, group, low, config, M, R, extra) -> "GroupKernel":
    """Launcher pieces shared by the templates, then the rendered module."""
    in_names = [op.value for op in low.inputs]
    uniq_inputs = list(dict.fromkeys(in_names))
    arg_of = {v: f"a{i}" for i, v in enumerate(uniq_inputs)}
    params = [op.param for op in low.inputs] + [op.param for op in low.outputs]
    param_doc = [f"input {op.value}: {op.dtype}{list(op.shape)}, domain strides {list(op.strides)} ({op.level})" for op in low.inputs]
    param_doc += [f"output {op.value}: {op.dtype}{list(op.shape)} ({op.level})" for op in low.outputs]
    checks = []
    for v in uniq_inputs:
        meta = graph.meta(v)
        checks.append(f"{arg_of[v]} = _expect({arg_of[v]}, {tuple(meta.shape)!r}, {tuple(meta.stride)!r}, {v!r})")
    allocs, out_vars = [], []
    dev = arg_of[uniq_inputs[0]] + ".device" if uniq_inputs else "'cuda'"
    given = []  # outputs launch() may be given a buffer for (a concatenation's slice, plan.concat)
    for i, op in enumerate(low.outputs):
        meta = graph.meta(op.value)
        st = output_stride(graph, op.value, len(low.D))
        stride = "" if TensorMeta(meta.shape, st, meta.dtype).contiguous else f", {st!r}"  # e.g. channels-last
        alloc = f"_alloc({tuple(op.shape)!r}, torch.{op.dtype}, {dev}{stride})"
        if placed_slot(graph, op.value) is not None:
            given.append(f"out{i}=None")
            alloc = f"{alloc} if out{i} is None else out{i}"
        allocs.append(f"out{i} = {alloc}")
        out_vars.append(f"out{i}")
    call_args = ", ".join([arg_of[op.value] for op in low.inputs] + out_vars)
    if "parts" in extra:
        extra["call_a"] = ", ".join([arg_of[op.value] for op in extra["full_loads"]] + extra["parts"])
        extra["call_b"] = ", ".join(extra["parts"] + [arg_of[op.value] for op in extra["row_loads"]] + out_vars
                                    + extra["bufs"])
        extra["call_c"] = ", ".join([arg_of[op.value] for op in low.inputs] + extra["bufs"] + out_vars)
    ops_used = ", ".join(graph.node(n).op for n in group.nodes)
    text = triton_template(template).render(
        kind=group.kind, gid=group.id, ops=ops_used, domain=list(low.D), rdims=list(low.rd), M=M, R=R,
        kernel=f"{group.id}_kernel", params=params, param_doc=param_doc,
        launch_args=", ".join([arg_of[v] for v in uniq_inputs] + given), input_doc=", ".join(uniq_inputs),
        output_doc=", ".join(op.value for op in low.outputs) + "".join(
            f"; {g[:-5]}= writes output {g[3:-5]} into that tensor (a concatenation's slice)" for g in given),
        launch_checks=checks, launch_allocs=allocs,
        num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 1)), call_args=call_args,
        returns="(" + ", ".join(out_vars) + ",)", **extra,
    )
    text = with_helpers(text)
    nbytes = sum(graph.meta(v).nbytes for v in uniq_inputs) + sum(graph.meta(o.value).nbytes for o in low.outputs)
    return GroupKernel(text, dict(config), uniq_inputs, [o.value for o in low.outputs], M, R, nbytes)
