"""Attention written by hand — bmm(q, kᵀ), a scale, optionally scores set to -inf where a boolean
mask holds (minGPT's causal mask), softmax over keys, bmm with v — becomes one
`scaled_dot_product_attention` call (exact in real arithmetic: the same softmax(q kᵀ · scale) v,
computed by a fused kernel that never writes the [.., S, L] scores; the mask becomes SDPA's
boolean `attn_mask`, its negation. A row masked entirely is NaN in eager; what the fused kernels
return for it is not checked, so such masks are assumed not to occur).

Matched precision, as measured on the H200 (scripts/attention_probe.py in the trees of `7472425` and
`3eb2c93`, docs/benchmarks.md):
under `fp32` PyTorch runs it with the memory-efficient kernel in float32 SIMT arithmetic (error
against float64 below the by-hand fp32 path's, 1.5x faster); under `bf16` with cuDNN's flash
kernel on bf16 q, k, v (fp32 softmax, as autocast's by-hand path; 15x faster). Under `tf32`
PyTorch's fused kernels have no TF32 path, but the SDPA node is also computed by a generated
kernel with TF32 dots (codegen/triton_attention.py, a choice timed against PyTorch's SDPA), which
ran 1.5-8.8x faster than the by-hand TF32 path with or without a causal mask on the H100
(scripts/attention_check.py at `05f38e4`, docs/benchmarks.md, section "Attention as one kernel
under tf32; ..."); so attention is rewritten under every policy. A mask computed from the model's weights
alone (a registered causal mask) is checked once per buffer version by the emitted forward and,
when it is the lower-triangular one, SDPA gets is_causal=True (emit.program), which skips the
masked half of the work.

The result's layout is fixed to what the fused kernels return, [b, h, s, d] indexed with
[b, s, h, d] in memory (capture.execute.fixed_layout), so the usual transpose(1, 2).reshape(b, s,
h * d) after attention is a free view.
"""
from __future__ import annotations

import torch

from kernelwright.analyze.classify import is_view
from kernelwright.capture.execute import resolve
from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta
from kernelwright.capture.shapes import contiguous_strides
from kernelwright.plan.dead_code import drop_unread

SDPA = "aten.scaled_dot_product_attention.default"
POLICIES = ("fp32", "tf32", "bf16")

_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
_CLONE = "aten.clone.default"


def heads_inner_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a [b, h, s, d] result stored as [b, s, h, d] (3-D and other ranks: contiguous)."""
    if len(shape) != 4:
        return contiguous_strides(shape)
    b, h, s, d = shape
    return (s * h * d, d, h * d, 1)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


class _Matcher:
    def __init__(self, graph: Graph):
        self.g = graph
        self.keep = set(graph.outputs) | set(graph.mutations)
        self.names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
        self.users: dict[str, int] = {}
        for n in graph.nodes:
            for name in n.inputs:
                self.users[name] = self.users.get(name, 0) + 1

    def only_user(self, name: str) -> OpNode | None:
        """The single node reading `name` (None when it has several readers or is kept)."""
        if self.users.get(name) != 1 or name in self.keep:
            return None
        return next(n for n in self.g.nodes if name in n.inputs)

    def source(self, name: str, batch: int, tail: tuple[int, ...], passed: list[str]) -> str | None:
        """Walk back from a bmm operand through views and contiguous clones; the last value met of
        rank >= 3 whose leading dims flatten to `batch` and whose last two dims are `tail` (the
        [b, h, s, d] tensor before the copies that made it [b*h, s, d]), else None."""
        best = None
        while True:
            m = self.g.meta(name)
            if m is None or m.dtype != "float32":
                return best
            if len(m.shape) >= 3 and tuple(m.shape[-2:]) == tail and _prod(m.shape[:-2]) == batch:
                best = name
            if self.g.is_input(name):
                return best
            n = self.g.node(name)
            fmt = str(n.kwargs.get("memory_format", "torch.contiguous_format"))
            if n.target not in _VIEWS and not (n.target == _CLONE and fmt == "torch.contiguous_format"):
                return best
            passed.append(name)
            name = n.args[0].name

    def untransposed(self, name: str) -> str | None:
        """k when `name` is k with its last two dims swapped (permute or transpose)."""
        if self.g.is_input(name):
            return None
        n = self.g.node(name)
        m = self.g.meta(name)
        r = len(m.shape)
        if n.target == "aten.permute.default":
            perm = list(n.args[1])
            want = list(range(r - 2)) + [r - 1, r - 2]
            return n.args[0].name if [p % r for p in perm] == want else None
        if n.target == "aten.transpose.int":
            dims = sorted(d % r for d in n.args[1:3])
            return n.args[0].name if dims == [r - 2, r - 1] else None
        return None

    def match(self, bmm1: OpNode) -> tuple[list[str], OpNode, str] | None:
        """(nodes made dead, the SDPA node, note) for an attention rooted at `bmm1`, else None."""
        g = self.g
        if bmm1.target != "aten.bmm.default" or bmm1.meta is None or bmm1.meta.dtype != "float32":
            return None
        bh, s, ell = bmm1.meta.shape
        passed: list[str] = []
        a, b = bmm1.args[0].name, bmm1.args[1].name
        q = self.source(a, bh, (s, g.meta(a).shape[-1]), passed)
        kt = self.source(b, bh, tuple(g.meta(b).shape[1:]), passed)
        k = self.untransposed(kt) if kt is not None else None
        passed.append(kt)
        if q is None or k is None or tuple(g.meta(k).shape) != tuple(g.meta(q).shape[:-2]) + (ell, g.meta(q).shape[-1]):
            return None
        lead = tuple(g.meta(q).shape[:-2])
        chain = [bmm1.name]
        cur = self.only_user(bmm1.name)
        if cur is not None and cur.target in _VIEWS and tuple(cur.meta.shape) == lead + (s, ell):
            chain.append(cur.name)
            cur = self.only_user(cur.name)
        scale = 1.0
        if cur is not None and cur.target in ("aten.div.Tensor", "aten.mul.Tensor") and len(cur.args) == 2 \
                and isinstance(cur.args[1], (int, float)) and not isinstance(cur.args[1], bool) and cur.args[1] != 0:
            scale = 1.0 / cur.args[1] if cur.target == "aten.div.Tensor" else float(cur.args[1])
            chain.append(cur.name)
            cur = self.only_user(cur.name)
        masked = self.mask(cur, chain[-1], lead + (s, ell)) if cur is not None else None
        if masked is not None:  # scores where a mask says so set to -inf (a causal mask)
            chain.append(cur.name)
            cur = self.only_user(cur.name)
        if cur is None or cur.target != "aten._softmax.default" or cur.args[2] \
                or cur.args[1] % len(cur.meta.shape) != len(cur.meta.shape) - 1:
            return None
        chain.append(cur.name)
        cur = self.only_user(cur.name)
        if cur is not None and cur.target in _VIEWS and tuple(cur.meta.shape) == (bh, s, ell):
            chain.append(cur.name)
            cur = self.only_user(cur.name)
        if cur is None or cur.target != "aten.bmm.default" or cur.args[0].name != chain[-1]:
            return None
        bmm2 = cur
        vf = bmm2.args[1].name
        dv = g.meta(vf).shape[-1]
        v = self.source(vf, bh, (ell, dv), passed)
        if v is None or tuple(g.meta(v).shape[:-2]) != lead:
            return None
        chain.append(bmm2.name)
        out = bmm2
        after = self.only_user(bmm2.name)
        if len(lead) > 1 and after is not None and after.target in _VIEWS and tuple(after.meta.shape) == lead + (s, dv):
            out = after
        elif len(lead) > 1:
            return None  # the [b*h, s, d] result itself is read: keep the graph as it is
        shape = lead + (s, dv)
        nodes, keep = [], None
        if masked is not None:  # SDPA's boolean mask says which scores take part: the negation
            mm = g.meta(masked)
            name = f"{out.name}_keep"
            while name in self.names:
                name += "_"
            self.names.add(name)
            keep = OpNode(name, "aten.logical_not.default", (Ref(masked),), {},
                          [TensorMeta.dense(tuple(mm.shape), "bool")])
            nodes.append(keep)
        node = OpNode(out.name, SDPA, (Ref(q), Ref(k), Ref(v), None if keep is None else Ref(keep.name), 0.0, False),
                      {"scale": scale}, [TensorMeta(shape, heads_inner_strides(shape), "float32")], out.fx)
        dead = [c for c in chain if c != out.name] + passed
        what = "bmm / scale / softmax / bmm" if keep is None else "bmm / scale / -inf where masked / softmax / bmm"
        note = (f"{out.name}: {what} over {'x'.join(map(str, shape))} is scaled_dot_product_attention({q}, {k}, {v}"
                + ("" if keep is None else f", attn_mask=~{masked}") + f", scale={scale:.6g}): one fused kernel, "
                "no scores in memory")
        return dead, nodes + [node], note

    def mask(self, n: OpNode, scores: str, shape: tuple[int, ...]) -> str | None:
        """The boolean mask when `n` sets the scores to -inf where it holds
        (`masked_fill(scores, mask, -inf)`, or `where(mask, -inf, scores)` as captured), and the
        mask broadcasts to the scores' [.., S, L] shape; else None."""
        if n.target == "aten.where.ScalarSelf" and len(n.args) == 3:
            m, fill, x = n.args
        elif n.target == "aten.masked_fill.Scalar" and len(n.args) == 3:
            x, m, fill = n.args
        else:
            return None
        if not (isinstance(m, Ref) and isinstance(x, Ref) and x.name == scores and isinstance(fill, float)
                and fill == float("-inf")):
            return None
        mm = self.g.meta(m.name)
        if mm is None or mm.dtype != "bool" or len(mm.shape) > len(shape) or any(
                a not in (1, b) for a, b in zip(reversed(mm.shape), reversed(shape))):
            return None
        return m.name


def _refresh_views(graph: Graph, nodes: list[OpNode], changed: set[str]) -> list[OpNode] | None:
    """`nodes` with the strides of every view of a value whose layout changed recomputed (on meta
    tensors, as PyTorch would); None when such a view cannot be taken of the new layout."""
    metas = {i.name: i.meta for i in graph.inputs}
    out = []
    for n in nodes:
        if any(i in changed for i in n.inputs) and (is_view(n) or n.target == "getitem"):
            def meta_tensor(v):
                if isinstance(v, Ref):
                    m = metas[v.name]
                    return torch.empty_strided(m.shape, m.stride, dtype=getattr(torch, m.dtype), device="meta")
                return [meta_tensor(x) for x in v] if isinstance(v, (list, tuple)) else v
            try:
                t = resolve(n.target)(*meta_tensor(list(n.args)), **n.kwargs)
            except RuntimeError:
                return None
            if not isinstance(t, torch.Tensor):
                return None
            n = OpNode(n.name, n.target, n.args, dict(n.kwargs), [TensorMeta(tuple(t.shape), tuple(t.stride()), n.meta.dtype)], n.fx)
            changed.add(n.name)
        metas[n.name] = n.meta
        out.append(n)
    return out


def attention(graph: Graph, policy: str = "fp32") -> tuple[Graph, list[str]]:
    """Every by-hand attention of `graph` as one scaled_dot_product_attention node (on a simplified
    graph: the no-op expands matmul leaves around its bmms already removed)."""
    if policy not in POLICIES:
        return graph, []
    m = _Matcher(graph)
    replace: dict[str, OpNode] = {}
    dead: set[str] = set()
    notes: list[str] = []
    for n in graph.nodes:
        hit = m.match(n) if n.name not in dead else None
        if hit is None:
            continue
        gone, new_nodes, note = hit
        dead.update(gone)
        replace[new_nodes[-1].name] = new_nodes
        notes.append(note)
    if not notes:
        return graph, []
    # the SDPA node (after its mask's negation) sits where the result was; its q, k, v and mask
    # are all defined before the first bmm or the masking, hence before it
    nodes = drop_unread(graph, [x for n in graph.nodes for x in replace.get(n.name, [n])], among=dead)
    nodes = _refresh_views(graph, nodes, {n[-1].name for n in replace.values()})
    if nodes is None:  # a reader views the result in a way its new layout does not allow
        return graph, []
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
