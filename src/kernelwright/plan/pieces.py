"""Elementwise work over a concatenation done piece by piece, so the concatenation joins finished
values and its pieces are computed straight into their slices of its buffer (plan.concat).

Two exact rules, applied until neither applies:

* **A concatenation through an elementwise op**: f(cat([p0, p1], d), y) is cat([f(p0, y0), f(p1, y1)], d),
  where y_i is y's slice along d beside piece i (y as it is where it broadcasts along d). The
  concatenation must be read by f alone and have at most `MAX_PIECES` pieces.
* **A slice through an elementwise op**: f(x, y)[.., a:b] is f(x[.., a:b], y[.., a:b]) where every
  reader of f's value is a slice, at most `MAX_PIECES` of them (each then computes its part; the
  whole is never written).

Rotary position embeddings are the case in point: `q * cos + cat([-q2, q1]) * sin` becomes a
concatenation of two elementwise halves, `q1 * cos1 - q2 * sin1` and `q2 * cos2 + q1 * sin2`, each
one kernel reading `q` once and writing its half of the result, where the sum over the joined copy
took three passes (the negation, the copy of `q1` into the joined tensor, the sum).
"""
from __future__ import annotations

from kernelwright.analyze.cost import consumers
from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, unique_name
from kernelwright.capture.shapes import contiguous_strides
from kernelwright.ops import POINTWISE
from kernelwright.plan.dead_code import drop_unread
from kernelwright.plan.weights import pure

CAT = "aten.cat.default"
SLICE = "aten.slice.Tensor"
MAX_PIECES = 4  # (a piece is a kernel launch of its own where no consumer's kernel takes it in)


def _tensor_args(n: OpNode) -> list[int]:
    return [k for k, a in enumerate(n.args) if isinstance(a, Ref)]


def _elementwise(graph: Graph, n: OpNode) -> bool:
    return (n.target in POINTWISE and pure(n.target) and len(n.outs) == 1 and n.meta is not None
            and all(graph.meta(n.args[k].name) is not None for k in _tensor_args(n))
            and not any(isinstance(a, (list, tuple)) for a in n.args))


class _Builder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
        self.users = consumers(graph)  # (once per pass: Graph.users scans every node)

    def only_reader(self, name: str) -> str | None:
        """The one node reading `name`, if exactly one does and the graph neither returns nor updates it."""
        users, g = self.users.get(name, []), self.graph
        if len(users) != 1 or name in g.outputs or name in g.mutations or g.is_input(name):
            return None
        return users[0].name

    def sliced(self, ref: Ref, rank: int, dim: int, start: int, end: int, full: int) -> tuple[Ref, list[OpNode]]:
        """`ref` (an operand of an op of `rank` dims) beside the op's [start, end) along `dim`:
        its slice where it spans the op's `full` extent there, itself where it broadcasts."""
        meta = self.graph.meta(ref.name)
        d = dim - (rank - len(meta.shape))
        if d < 0 or meta.shape[d] == 1:
            return ref, []
        if meta.shape[d] != full:
            raise ValueError("operand neither spans nor broadcasts along the dim")
        shape = tuple(end - start if j == d else s for j, s in enumerate(meta.shape))
        node = OpNode(unique_name(self.names, f"{ref.name}_{start}_{end}"), SLICE, (ref, d, start, end), {},
                      [TensorMeta(shape, meta.stride, meta.dtype)])
        return Ref(node.name), [node]

    def part(self, n: OpNode, rank: int, dim: int, start: int, end: int, swap: dict[int, Ref]) -> list[OpNode]:
        """Nodes computing `n`'s [start, end) along `dim`: its tensor operands sliced (those in
        `swap` replaced as given), the op itself last, dense."""
        full = n.meta.shape[dim]
        args, made = list(n.args), []
        for k in _tensor_args(n):
            if k in swap:
                args[k] = swap[k]
            else:
                args[k], nodes = self.sliced(n.args[k], rank, dim, start, end, full)
                made += nodes
        shape = tuple(end - start if j == dim else s for j, s in enumerate(n.meta.shape))
        made.append(OpNode(unique_name(self.names, f"{n.name}_{start}_{end}"), n.target, tuple(args), dict(n.kwargs),
                           [TensorMeta(shape, contiguous_strides(shape), n.meta.dtype)]))
        return made


def _cat_down(graph: Graph, n: OpNode, b: _Builder) -> list[OpNode] | None:
    """Nodes replacing elementwise `n` when one operand is a concatenation only `n` reads."""
    if not _elementwise(graph, n):
        return None
    cats = [k for k in _tensor_args(n) if not graph.is_input(n.args[k].name)
            and graph.node(n.args[k].name).target == CAT]
    if len(cats) != 1 or len(set(n.args[k].name for k in _tensor_args(n))) != len(_tensor_args(n)):
        return None
    cat = graph.node(n.args[cats[0]].name)
    pieces, d = cat.args[0], cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    rank, crank = len(n.meta.shape), len(cat.meta.shape)
    if b.only_reader(cat.name) != n.name or not 2 <= len(pieces) <= MAX_PIECES \
            or not all(isinstance(p, Ref) for p in pieces):
        return None
    d = (d % crank) + rank - crank
    if n.meta.shape[d] != cat.meta.shape[d - rank + crank]:
        return None  # (the concatenation broadcasts along its own dim)
    made, parts, start = [], [], 0
    try:
        for p in pieces:
            size = graph.meta(p.name).shape[d - rank + crank]
            if size == 0:
                return None
            nodes = b.part(n, rank, d, start, start + size, {cats[0]: p})
            made += nodes
            parts.append(Ref(nodes[-1].name))
            start += size
    except ValueError:
        return None
    return made + [OpNode(n.name, CAT, (parts, d), {}, list(n.outs), n.fx)]


def _slice_up(graph: Graph, s: OpNode, b: _Builder) -> list[OpNode] | None:
    """Nodes replacing slice `s` of an elementwise value that only slices read."""
    if s.target != SLICE or len(s.args) < 4 or not isinstance(s.args[0], Ref) or graph.is_input(s.args[0].name) \
            or not all(isinstance(a, int) for a in s.args[1:4]) or (len(s.args) > 4 and s.args[4] != 1):
        return None  # (start / end given as numbers, step 1)
    src = graph.node(s.args[0].name)
    rank = len(src.meta.shape) if src.meta else 0
    users = b.users.get(src.name, [])
    if not _elementwise(graph, src) or src.name in graph.outputs or src.name in graph.mutations \
            or len(users) > MAX_PIECES or any(u.target != SLICE for u in users):
        return None
    d = s.args[1] % rank
    full = src.meta.shape[d]
    start = min(max(0, s.args[2] + full if s.args[2] < 0 else s.args[2]), full)
    end = min(full, s.args[3] + full if s.args[3] < 0 else s.args[3])
    if end <= start:
        return None
    try:
        made = b.part(src, rank, d, start, end, {})
    except ValueError:
        return None
    last = made[-1]
    return made[:-1] + [OpNode(s.name, last.target, last.args, last.kwargs, list(s.outs), s.fx)]


def compute_by_pieces(graph: Graph) -> tuple[Graph, list[str]]:
    """The two rules of this module until neither applies; one note per rewritten node."""
    notes: list[str] = []
    for _ in range(64):  # (a chain of k elementwise ops over a concatenation takes about 2k passes)
        b, nodes, touched = _Builder(graph), [], set()
        for n in graph.nodes:
            reads = {a.name for a in n.args if isinstance(a, Ref)}
            new, note = None, None
            if not reads & touched:  # (this pass's view of a rewritten operand is stale)
                new = _cat_down(graph, n, b)
                if new is not None:
                    cat = next(r for r in reads if not graph.is_input(r) and graph.node(r).target == CAT)
                    note = f"{n.name}: computed per piece of {cat}"
                else:
                    new = _slice_up(graph, n, b)
                    note = f"{n.name}: computed from slices of {n.args[0].name}'s operands" if new is not None else None
            if new is None:
                nodes.append(n)
                continue
            nodes += new
            touched.add(n.name)
            notes.append(note)
        if not touched:
            return graph, notes
        rebuilt = Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported)
        graph = Graph(graph.name, graph.inputs, drop_unread(rebuilt, nodes), list(graph.outputs),
                      dict(graph.mutations), graph.exported)
    return graph, notes
