"""A node template for copies between any two layouts: `clone(x)` of a permuted, sliced or
broadcast view into a dense tensor (the heads of by-hand attention, `q.view(b, s, h, d).transpose(1,
2)` made contiguous for `bmm`, and their merge back), or `_to_copy(x, dtype=...)` that also casts
between float dtypes, as a Triton kernel (templates/triton/strided_copy.py.j2), searched against
torch's copy. The NCHW <-> channels-last copies are codegen/triton_layout.py's.

The dims are first merged wherever both layouts allow (`copy_plan`), leaving the output's innermost
dim A and the input's innermost dim B:
- A == B ("rows"): A is the innermost dim on both sides; a program copies BLOCK_R rows of
  BLOCK_A elements, the rows' offsets computed from their index (16-byte accesses along A where
  the input holds it contiguously too);
- A != B ("transpose"): a program moves a BLOCK_B x BLOCK_A tile of (B, A) at one index of the
  other dims, loads coalesced along B, stores along A (Triton exchanges the tile through shared
  memory, a tiled transpose).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode
from kernelwright.capture.shapes import dense_permuted
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.node_kernels import NodeKernel, OneTensorOp
from kernelwright.codegen.templating import triton_template
from kernelwright.space.axes import Axis, Space, next_pow2
from kernelwright.space.config import Config

NAME = "triton.strided_copy"
DTYPES = ("float32", "float16", "bfloat16")
INT32_LIMIT = 2**31  # offsets at or past this are computed in int64
# smaller copies stay torch's: one launch either way, so timing a kernel for them costs more
# tuning time than it can save (16384 elements: 64 KiB of float32)
MIN_ELEMENTS = 1 << 14


@dataclass(frozen=True)
class Dim:
    size: int
    xs: int  # the input's stride
    ys: int  # the output's stride


@dataclass(frozen=True)
class CopyPlan:
    """The copy after merging dims: `a` (the output's innermost, ys 1), `b` (the input's innermost;
    None when it is `a`), and the other dims, outermost first, whose flat index a program (or a
    row) decomposes."""
    a: Dim
    b: Dim | None
    rest: tuple[Dim, ...]
    wide: bool  # offsets need int64

    @property
    def kind(self) -> str:
        return "rows" if self.b is None else "transpose"

    @property
    def n_rest(self) -> int:
        return math.prod(d.size for d in self.rest)


def copy_plan(shape, xs, ys) -> CopyPlan:
    """The dims of a copy from strides `xs` to dense strides `ys`, merged and split into A, B, rest."""
    dims = sorted((Dim(n, x, y) for n, x, y in zip(shape, xs, ys) if n != 1), key=lambda d: -d.ys)
    merged: list[Dim] = []
    for d in dims:  # outer to inner in the output's order
        if merged and merged[-1].ys == d.ys * d.size and merged[-1].xs == d.xs * d.size:
            merged[-1] = Dim(merged[-1].size * d.size, d.xs, d.ys)
        else:
            merged.append(d)
    if not merged:
        merged = [Dim(1, 1, 1)]
    a = merged[-1]
    moving = [d for d in merged if d.xs != 0]
    b = min(moving, key=lambda d: d.xs) if moving else a
    if b is a or b.xs == a.xs:
        b = None
    rest = tuple(d for d in merged[:-1] if d is not b)
    span = sum((d.size - 1) * max(abs(d.xs), d.ys) for d in merged)
    return CopyPlan(a, b, rest, span + 1 >= INT32_LIMIT)


def offsets(rest: tuple[Dim, ...], var: str, side: str) -> str:
    """The expression of the offset, on the input's (`side` "x") or the output's ("y") strides, of
    flat index `var` over the dims `rest` (outermost first, the last one varying fastest)."""
    terms, inner = [], 1
    for i, d in reversed(list(enumerate(rest))):
        stride = d.xs if side == "x" else d.ys
        if stride != 0:
            index = var if inner == 1 else f"({var} // {inner})"
            terms.insert(0, f"({index} % {d.size}) * {stride}" if i > 0 else f"{index} * {stride}")
        inner *= d.size
    return " + ".join(terms) or f"{var} * 0"


def _top(size: int, most: int) -> int:
    """The largest block worth trying along a dim of `size`: its power of two, 16 to `most`."""
    return max(16, min(most, next_pow2(size)))


class StridedCopyTemplate(OneTensorOp):
    name = NAME

    TARGETS = ("aten.clone.default", "aten._to_copy.default")
    KIND = "clone or cast"

    def check(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        kwargs = set(node.kwargs)
        if node.target == "aten.clone.default" and not kwargs <= {"memory_format"}:
            return "a clone with arguments other than a memory format"
        if node.target == "aten._to_copy.default" and not kwargs <= {"dtype", "memory_format"}:
            return "a cast with more than a dtype and a memory format"
        x, y = graph.meta(node.args[0].name), node.meta
        if x is None or y is None or x.dtype not in DTYPES or y.dtype not in DTYPES:
            return "only floating tensors"
        if tuple(x.shape) != tuple(y.shape):
            return "a change of shape"
        if math.prod(y.shape) < MIN_ELEMENTS:
            return f"fewer than {MIN_ELEMENTS} elements (one launch either way: torch's copy)"
        if not dense_permuted(y.shape, y.stride):
            return "the result's layout is not dense"
        if x.stride == y.stride:
            return "the same layout on both sides (a plain copy or cast)"
        from kernelwright.codegen.triton_layout import TEMPLATE as layout_copy

        if layout_copy.supports(graph, node, used) is None:
            return "a copy between the contiguous and channels-last layouts (triton.layout_copy's)"
        return None

    def _plan(self, graph: Graph, node: OpNode) -> CopyPlan:
        x, y = graph.meta(node.args[0].name), node.meta
        return copy_plan(tuple(x.shape), tuple(x.stride), tuple(y.stride))

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        p = self._plan(graph, node)
        top_a = _top(p.a.size, 256)
        if p.b is None:
            fewest = min(1024, top_a * next_pow2(p.n_rest))  # (a small copy: every row in one tile)
            return Space(NAME, [Axis("BLOCK_A", [v for v in (16, 32, 64, 128, 256) if v <= top_a]),
                                Axis("BLOCK_R", [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                                Axis("num_warps", [2, 4, 8])],
                         [lambda c: fewest <= c["BLOCK_A"] * c["BLOCK_R"] <= 8192,
                          lambda c: c["BLOCK_R"] <= next_pow2(p.n_rest)]).configs()
        top_b = _top(p.b.size, 128)
        return Space(NAME, [Axis("BLOCK_A", [v for v in (16, 32, 64, 128) if v <= top_a]),
                            Axis("BLOCK_B", [v for v in (16, 32, 64, 128) if v <= top_b]),
                            Axis("num_warps", [2, 4, 8])],
                     [lambda c: 4 <= c["BLOCK_A"] * c["BLOCK_B"] // (32 * c["num_warps"]) <= 64]).configs()

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        """rows: the whole row (up to 256 elements) by as many rows as make 4096 elements, 4 warps
        (32 elements a thread); transpose: 64 x 32 tiles with 4 warps (16 elements a thread), as
        the layout copy's, smaller where the dims are."""
        p = self._plan(graph, node)
        block_a = _top(p.a.size, 256)
        if p.b is None:
            return Config.make(NAME, BLOCK_A=block_a, BLOCK_R=min(4096 // block_a, next_pow2(p.n_rest)), num_warps=4)
        block_a, block_b = min(64, block_a), min(32, _top(p.b.size, 128))
        return Config.make(NAME, BLOCK_A=block_a, BLOCK_B=block_b, num_warps=4 if block_a * block_b >= 512 else 2)

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        x, y = graph.meta(node.args[0].name), node.meta
        p = self._plan(graph, node)
        blocks = {k: int(config[k]) for k in ("BLOCK_A", "BLOCK_R", "BLOCK_B", "num_warps") if k in config}
        text = triton_template("strided_copy.py.j2").render(
            node=node.name, target=node.target, input=node.args[0].name, dtype=x.dtype, out_dtype=y.dtype,
            shape=tuple(x.shape), in_stride=tuple(x.stride), out_stride=tuple(y.stride), plan=p,
            offsets=lambda var, side: offsets(p.rest, var, side), n_rest=p.n_rest, kernel=f"{node.name}_copy_kernel",
            **blocks)
        return NodeKernel(with_helpers(text), [node.args[0].name], 1)


TEMPLATE = StridedCopyTemplate()
