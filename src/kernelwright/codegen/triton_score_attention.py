"""A node template for attention whose scores go through elementwise ops instead of a softmax,
written by hand: bmm(q, kᵀ) -> a chain of elementwise ops (a scale, a mask applied with
masked_fill, ReLU: the ReLU self-attention of KernelBench's level 3) -> bmm with v. One Triton
kernel (templates/triton/score_attention.py.j2) computes the chain on each [BLOCK_M, BLOCK_N]
tile of scores in registers and multiplies it into v, so the [.., S, L] scores are never written
(the two bmms and the elementwise kernel between them read and write them three times); a tile
the chain maps to zeros (the blocks a causal mask and a ReLU leave out) skips v and the second
product, exactly (a NaN is not zero).

The template is anchored at the second bmm and absorbs everything back to the first one's
operands (`match`): the views that flatten the heads for the bmms, the copies that made q, kᵀ and
v contiguous for them (the kernel reads their sources in place, with their strides), the first
bmm and the chain. Every value it absorbs must be read only by the next node in the pattern. The
library choice it is timed against runs those nodes as the plan's other units would (their own
chosen kernels). A softmax between the bmms is plan/attention.py's rewrite into
scaled_dot_product_attention instead (codegen/triton_attention.py).

The products run under the precision policy (IEEE float32 dots under fp32, TF32 under tf32, bf16
operands as they come under bf16, the chain's values rounded to them for the second product as
the library's bmm reads them); the chain itself in float32, from the op table
(codegen/triton_ops.py) that the fused group kernels use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.capture.shapes import broadcast_strides
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.templating import triton_template
from kernelwright.codegen.triton_attention import DTYPES, MAX_HEAD_DIM, attention_space, dot_precision, meta4, tile_offset
from kernelwright.codegen.triton_ops import EXTRA_ARGS, OPERANDS, POINTWISE, format_float
from kernelwright.space.axes import next_pow2
from kernelwright.space.config import Config

NAME = "triton.score_attention"
BMM = "aten.bmm.default"
VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
PASS_THROUGH = VIEWS | {"aten.expand.default", "aten.alias.default"}  # (element count unchanged: checked)


@dataclass(frozen=True)
class Operand:
    """A bmm operand [G, R, C] as the kernel reads it: `value` viewed as [B, H, R, C] with `strides`."""
    value: str
    strides: tuple[int, int, int, int]
    nodes: tuple[str, ...]  # the view (and the copy before it) the kernel reads past


@dataclass(frozen=True)
class Match:
    q: Operand
    k: Operand  # kᵀ: [B, H, D, L]
    v: Operand
    chain: tuple[str, ...]  # the elementwise nodes, first to last
    links: dict  # chain node -> the argument position that continues the chain
    extras: tuple[tuple[str, tuple[int, int, int, int]], ...]  # tensors the chain reads besides the scores
    nodes: tuple[str, ...]  # every node the kernel computes, in graph order
    result: str  # the value the kernel writes: the second bmm's, or the heads merged after it
    ost: tuple[int, int, int, int]  # the result's strides over [B, H, S, DV]
    B: int
    H: int
    S: int
    L: int
    D: int
    DV: int
    dtype: str


def _sole_reader(graph: Graph, value: str, reader: str) -> bool:
    """Whether node `reader` is the only reader of `value`, which the model neither returns nor
    writes into a buffer."""
    users = graph.users(value)
    return (len(users) == 1 and users[0].name == reader and value not in graph.outputs
            and value not in graph.mutations)


def _operand(graph: Graph, value: str, reader: str) -> tuple[str, tuple, tuple, tuple[str, ...]] | None:
    """(source, its shape, its strides, nodes read past) of a 3-D bmm operand: the 4-D value a view
    made it from (past a copy made for that view), or the 3-D value itself."""
    meta = graph.meta(value)
    if meta is None or len(meta.shape) != 3:
        return None
    if not graph.is_input(value) and _sole_reader(graph, value, reader):
        node = graph.node(value)
        src = node.args[0].name if node.target in VIEWS and isinstance(node.args[0], Ref) else None
        sm = graph.meta(src) if src else None
        if sm is not None and len(sm.shape) == 4 and sm.shape[0] * sm.shape[1] == meta.shape[0] \
                and tuple(sm.shape[2:]) == tuple(meta.shape[1:]):
            nodes: tuple[str, ...] = (value,)
            copy = None if graph.is_input(src) else graph.node(src)
            if copy is not None and copy.target == "aten.clone.default" and set(copy.kwargs) <= {"memory_format"} \
                    and isinstance(copy.args[0], Ref) and _sole_reader(graph, src, value):
                nodes, src = (src, value), copy.args[0].name
                sm = graph.meta(src)
            return src, tuple(sm.shape), tuple(sm.stride), nodes
    return (value, *meta4(meta), ())


def _as_heads(shape, strides, B: int, H: int) -> tuple[int, int, int, int] | None:
    """4-D strides reading an operand of 4-D `shape` over B x H (batch, head) pairs: its own where
    its [B, H] are those, (s * H, s) where it holds the B * H pairs in one dim of stride s."""
    if tuple(shape[:2]) == (B, H):
        return tuple(strides)
    if shape[0] == B * H and shape[1] == 1:
        return (strides[0] * H, strides[0], *strides[2:])
    return None


def match(graph: Graph, anchor: OpNode) -> Match | None:
    """The pattern ending at the bmm `anchor` (module docstring), or None."""
    if anchor.target != BMM or len(anchor.args) != 2 or not all(isinstance(a, Ref) for a in anchor.args):
        return None
    p, v = anchor.args[0].name, anchor.args[1].name
    vop = _operand(graph, v, anchor.name)
    # back from the scores the second bmm reads: views and elementwise ops, each value read only by
    # the next, to the first bmm
    chain, links, passed, reader, value = [], {}, [], anchor.name, p
    while True:
        if graph.is_input(value) or not _sole_reader(graph, value, reader):
            return None
        node = graph.node(value)
        if node.target == BMM:
            first = node
            break
        if node.target in PASS_THROUGH:
            src = node.args[0]
            if not isinstance(src, Ref) or math.prod(graph.meta(src.name).shape) != math.prod(node.meta.shape):
                return None
            passed.append(value)
            reader, value = value, src.name
            continue
        if node.target not in POINTWISE or node.meta is None:
            return None
        refs = [i for i, a in enumerate(node.args[:OPERANDS.get(node.target, len(node.args))]) if isinstance(a, Ref)]
        on = [i for i in refs if tuple(graph.meta(node.args[i].name).shape) == tuple(node.meta.shape)
              and not graph.is_input(node.args[i].name) and _sole_reader(graph, node.args[i].name, node.name)
              and graph.node(node.args[i].name).target in set(POINTWISE) | PASS_THROUGH | {BMM}]
        if len(on) != 1:
            return None
        chain.insert(0, node.name)
        links[node.name] = on[0]
        reader, value = value, node.args[on[0]].name
    if len(first.args) != 2 or not all(isinstance(a, Ref) for a in first.args):
        return None
    qop, kop = _operand(graph, first.args[0].name, first.name), _operand(graph, first.args[1].name, first.name)
    if qop is None or kop is None or vop is None:
        return None
    G, S, D = graph.meta(first.args[0].name).shape
    L, DV = graph.meta(v).shape[1:]
    if tuple(graph.meta(p).shape) != (G, S, L) or graph.meta(v).shape[0] != G:
        return None  # (views that regroup the scores between the bmms)
    heads = next((shape[:2] for _, shape, _, _ in (qop, kop, vop) if shape[1] != 1), (G, 1))
    B, H = heads
    ops = []
    for src, shape, strides, nodes in (qop, kop, vop):
        st = _as_heads(shape, strides, B, H)
        if st is None:
            return None
        ops.append(Operand(src, st, nodes))
    dtypes = {graph.meta(o.value).dtype for o in ops}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES or max(D, DV) > MAX_HEAD_DIM:
        return None
    # the chain's other tensors, each read as [B, H, S, L] (broadcast)
    extras, seen = [], set()
    for name in chain:
        node = graph.node(name)
        if node.meta.dtype not in ("float32", "bfloat16", "float16", "bool") or \
                tuple(node.meta.shape) not in ((B, H, S, L), (B * H, S, L)):
            return None
        for i, a in enumerate(node.args[:OPERANDS.get(node.target, len(node.args))]):
            if not isinstance(a, Ref) or i == links[name] or a.name in seen:
                continue
            m = graph.meta(a.name)
            dom = tuple(node.meta.shape)
            st = broadcast_strides(tuple(m.shape), tuple(m.stride), dom) if m is not None else None
            if st is None or m.dtype not in ("float32", "bfloat16", "float16", "bool"):
                return None
            if dom == (B, H, S, L):
                extras.append((a.name, tuple(st)))
            elif dom == (B * H, S, L):
                extras.append((a.name, (st[0] * H, st[0], st[1], st[2])))
            else:
                return None
            seen.add(a.name)
    result, ost, merged = _merged_heads(graph, anchor, B, H, S, DV)
    absorbed = {first.name, anchor.name, *chain, *passed, *(n for o in ops for n in o.nodes), *merged}
    order = tuple(n.name for n in graph.nodes if n.name in absorbed)
    return Match(ops[0], ops[1], ops[2], tuple(chain), links, tuple(extras), order, result, ost,
                 B, H, S, L, D, DV, next(iter(dtypes)))


def _merged_heads(graph: Graph, anchor: OpNode, B: int, H: int, S: int, DV: int):
    """(the value the kernel writes, its strides over [B, H, S, DV], the nodes after the anchor it
    computes): the usual merge of the heads, y.view(B, H, S, DV).transpose(1, 2).contiguous(),
    written in place of the second bmm's [B * H, S, DV] result, else that result."""
    own = anchor.meta.stride
    plain = (anchor.name, (own[0] * H, own[0], own[1], own[2]), ())
    value, nodes = anchor.name, []
    for want in ("view", "permute", "clone"):
        users = graph.users(value)
        if len(users) != 1 or value in graph.outputs or value in graph.mutations:
            return plain
        n = users[0]
        ok = {"view": n.target in VIEWS and tuple(n.meta.shape) == (B, H, S, DV),
              "permute": n.target == "aten.permute.default" and list(n.args[1]) == [0, 2, 1, 3],
              "clone": n.target == "aten.clone.default" and set(n.kwargs) <= {"memory_format"}}[want]
        if not ok:
            return plain
        value = n.name
        nodes.append(n.name)
    st = graph.node(value).meta.stride  # over [B, S, H, DV]
    return value, (st[0], st[2], st[1], st[3]), tuple(nodes)


class ScoreAttentionTemplate:
    """Node template for hand-written attention with elementwise scores (module docstring)."""

    name = NAME
    by_policy = True  # the products' precision (DOT) follows the policy

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target != BMM:
            return f"{node.target} is not a bmm"
        return None if match(graph, node) is not None else \
            "not the second bmm of attention with elementwise scores (bmm -> elementwise ops -> bmm)"

    def absorbed(self, graph: Graph, node: OpNode):
        m = match(graph, node)
        if m is None:
            return None
        return list(m.nodes), [m.q.value, m.k.value, m.v.value] + [x for x, _ in m.extras], m.result

    def _sizes(self, m: Match) -> dict:
        return dict(B=m.B, H=m.H, S=m.S, L=m.L, D=m.D, DV=m.DV)

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> list[Config]:
        m = match(graph, node)
        return [Config.make(NAME, **c.as_dict()) for c in attention_space(self._sizes(m), m.dtype, policy)]

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> Config:
        """64 queries x 64 keys with 4 warps and 2 stages (32 keys for IEEE float32 dots), the
        nearest that fits where these do not: every key block is visited (the chain may give a
        masked score any value), so no tile is sized for skipped work."""
        m = match(graph, node)
        space = self.space(graph, node, spec, policy)
        want = dict(BLOCK_M=64, BLOCK_N=32 if dot_precision(m.dtype, policy) == "ieee" else 64, num_warps=4, num_stages=2)
        hit = [c for c in space if all(c[k] == v for k, v in want.items())]
        return hit[0] if hit else min(space, key=lambda c: (abs(c["BLOCK_M"] * c["BLOCK_N"] - 4096), c["num_stages"]))

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        m = match(graph, node)
        if m is None:
            raise ValueError(f"{NAME} cannot render {node.name}: {self.supports(graph, node, used)}")
        cfg = dict(config.as_dict() if isinstance(config, Config) else config)
        out = graph.meta(m.result)
        names = {x: f"x{i}" for i, (x, _) in enumerate(m.extras)}
        lines, prev = [], "s"
        for k, name in enumerate(m.chain):
            n = graph.node(name)
            ops = OPERANDS.get(n.target, len(n.args))
            args = []
            for i, a in enumerate(n.args[:ops]):
                if i == m.links[name]:
                    args.append(prev)
                elif isinstance(a, Ref):
                    args.append(names[a.name])
                else:
                    args.append(format_float(a))
            kw = dict(zip(EXTRA_ARGS.get(n.target, []), n.args[ops:]))
            kw.update(n.kwargs)
            prev = f"c{k}"
            lines.append((prev, POINTWISE[n.target](args, kw), name))
        inputs = [m.q.value, m.k.value, m.v.value] + [x for x, _ in m.extras]
        text = triton_template("score_attention.py.j2").render(
            node=node.name, kernel=f"{node.name}_score_attention_kernel", dtype=m.dtype,
            q=m.q, k=m.k, v=m.v, extras=[(x, names[x], st, tuple(graph.meta(x).shape), tuple(graph.meta(x).stride),
                                          graph.meta(x).dtype) for x, st in m.extras],
            metas={x: (tuple(graph.meta(x).shape), tuple(graph.meta(x).stride), graph.meta(x).dtype) for x in inputs},
            chain=lines, result=prev, ops=" -> ".join(graph.node(n).op for n in m.chain) or "none",
            result_name=m.result, ost=m.ost, out_shape=tuple(out.shape), out_stride=tuple(out.stride), at=tile_offset,
            dot=None if m.dtype != "float32" else cfg["DOT"],
            BLOCK_D=max(16, next_pow2(m.D)), BLOCK_DV=max(16, next_pow2(m.DV)),
            wide=max(graph.meta(x).span for x in inputs + [m.result]) >= 2**31,
            **self._sizes(m), **{k: int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")})
        return NodeKernel(with_helpers(text), inputs, 1)


TEMPLATE = ScoreAttentionTemplate()
