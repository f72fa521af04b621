"""Exact graph rewrites applied before fusion planning.

Only rewrites that are exact in real arithmetic. `simplify` removes ops that return their input's value
(a clone of a contiguous tensor, an alias, an expand or view to the same shape, a cast to the same
dtype, multiplying or dividing by 1, adding or subtracting 0). `row_rewrites` lets a row group
absorb its consumers: a full sum after a row op becomes a per-row sum plus a sum of rows, and a
gather from a log-softmax reads the input and subtracts the row's logsumexp (both re-associate
sums: exact in real arithmetic, rounding bounded by verification). `fold_eval_batch_norm` folds an
inference-mode batch norm into the Linear before it where that removes a pass. A rewrite never touches a
value the model returns or a buffer it updates, so outputs never alias inputs.
"""
from __future__ import annotations

import torch

from kernelwright.analyze.classify import is_view
from kernelwright.analyze.cost import consumers
from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta, rebuilt, reading, unique_name
from kernelwright.capture.shapes import channels_last_strides, refine_strides
from kernelwright.ops import COMPOSITES, EVAL_BN, NORMS, POINTWISE, POOLS, REDUCTIONS, reduction_spec
from kernelwright.plan.algebra import algebra as exact_algebra
from kernelwright.plan.attention import POLICIES as ATTENTION_POLICIES, SDPA, attention
from kernelwright.plan.dead_code import drop_unread
from kernelwright.plan.norm_split import split_norms_before_pools
from kernelwright.plan.pieces import compute_by_pieces
from kernelwright.plan.recompose import recompose_mish
from kernelwright.plan.recompute import recompute_reads
from kernelwright.plan.instance_norm import instance_norm_rows
from kernelwright.plan.weights import pure, weight_roots


def _is_one(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _is_zero(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


def noop_source(graph: Graph, n: OpNode) -> str | None:
    """The value `n` merely passes on, or None when `n` computes something."""
    if not n.args or not isinstance(n.args[0], Ref) or n.meta is None:
        return None
    src = n.args[0].name
    m = graph.meta(src)
    if m is None or m.shape != n.meta.shape or m.dtype != n.meta.dtype:
        return None
    t = n.target
    if t == "aten.alias.default":
        return src
    if t == "aten.clone.default":
        fmt = n.kwargs.get("memory_format")
        return src if m.contiguous and (fmt is None or str(fmt) == "torch.contiguous_format") else None
    if t in ("aten.expand.default", "aten.view.default", "aten._unsafe_view.default"):
        return src if m.stride == n.meta.stride else None
    if t == "aten._to_copy.default":
        allowed = {"dtype", "device", "layout", "memory_format"}
        if set(n.kwargs) - allowed or n.kwargs.get("memory_format") not in (None,) or m.stride != n.meta.stride:
            return None
        return src
    if len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1:
        if t in ("aten.mul.Tensor", "aten.div.Tensor") and _is_one(n.args[1]):
            return src
        if t in ("aten.add.Tensor", "aten.sub.Tensor") and _is_zero(n.args[1]):
            return src
    return None


def _with_nodes(graph: Graph, nodes: list[OpNode]) -> Graph:
    """`graph` with its node list replaced (same inputs, outputs and buffer updates)."""
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported)


def _forward_values(graph: Graph, find) -> tuple[Graph, list[str]]:
    """Drop every node for which `find(node)` names an earlier value it equals, returning
    (value, note); later readers read that value. `find` sees each node once, in order, with its
    arguments already forwarded; a value the model returns or a buffer it updates is never dropped."""
    keep = set(graph.outputs) | set(graph.mutations)
    mapping: dict[str, str] = {}
    nodes, notes = [], []
    for n in graph.nodes:
        n = reading(n, mapping)
        hit = find(n)
        if hit is not None and n.name not in keep:
            mapping[n.name] = hit[0]
            notes.append(hit[1])
        else:
            nodes.append(n)
    if not notes:
        return graph, []
    return _with_nodes(graph, nodes), notes


def dtype_only_casts(graph: Graph) -> tuple[Graph, list[str]]:
    """Casts that name the layout and device they keep as casts of their dtype alone: AOTAutograd's
    backward graphs write a gradient's widening as `_to_copy(x, dtype=float32, layout=torch.strided,
    device=cuda:0)`, which every pass reading a cast by its dtype (plan.fusion's elementwise
    ops, `plain_cast`) would otherwise keep as a library copy of its own. The graph's values live
    on one device (the emitted forward passes every device argument as its first input's)."""
    nodes, changed = [], False
    for n in graph.nodes:
        kw = n.kwargs
        if (n.target == "aten._to_copy.default" and {"layout", "device", "pin_memory"} & set(kw)
                and set(kw) <= {"dtype", "layout", "device", "pin_memory"} and not kw.get("pin_memory")
                and str(kw.get("layout", torch.strided)) == str(torch.strided)):
            n = OpNode(n.name, n.target, n.args, {k: v for k, v in kw.items() if k == "dtype"}, n.outs, n.fx)
            changed = True
        nodes.append(n)
    return (_with_nodes(graph, nodes) if changed else graph), []


def simplify(graph: Graph, views: bool = True) -> tuple[Graph, list[str]]:
    """The graph without no-op nodes, and one line per removed node; a returned copy of a value
    the forward computes (a dropout with p=0 or in eval mode at the end of a block) returns that
    value instead (`returned_copies`; `views`: also a view of a computed value)."""
    def find(n):
        src = noop_source(graph, n)
        return None if src is None else (src, f"{n.name}: {n.target} returns its input {src} unchanged")

    graph, notes = _forward_values(graph, find)
    graph, more = returned_copies(graph, views)
    return graph, notes + more


def _storage_root(graph: Graph, value: str) -> str:
    """The value whose memory `value` views (itself when it is no view)."""
    while not graph.is_input(value):
        n = graph.node(value)
        if not is_view(n) or not n.args or not isinstance(n.args[0], Ref):
            break
        value = n.args[0].name
    return value


def returned_copies(graph: Graph, views: bool = True) -> tuple[Graph, list[str]]:
    """A returned no-op copy (`noop_source`: a clone of a contiguous value) of a value the forward
    computes returns that value itself: one pass over memory less. Not where the value views a
    model input, parameter or buffer (the caller would get their memory), nor where another
    returned value or a buffer update shares its memory (outputs would alias each other); with
    `views` False, only where the value is no view at all (what an autograd.Function returns, as
    an AOTAutograd forward's results are, must not be a view that the caller could modify in
    place: autograd forbids that for views a custom Function made)."""
    roots = {o: _storage_root(graph, o) for o in dict.fromkeys(list(graph.outputs) + list(graph.mutations))}
    rename, notes = {}, []
    for out in dict.fromkeys(graph.outputs):
        if graph.is_input(out) or graph.outputs.count(out) != 1 or out in graph.mutations:
            continue
        n = graph.node(out)
        src = noop_source(graph, n) if n.target == "aten.clone.default" and not graph.users(out) else None
        if src is None or src in roots:
            continue
        root = _storage_root(graph, src)
        if graph.is_input(root) or (root != src and not views) or any(r == root for o, r in roots.items() if o != out):
            continue
        rename[out] = src
        roots[out] = root
        notes.append(f"{out}: the returned copy of {src} returns {src} itself")
    if not rename:
        return graph, []
    nodes = [n for n in graph.nodes if n.name not in rename]
    outputs = [rename.get(o, o) for o in graph.outputs]
    return Graph(graph.name, graph.inputs, nodes, outputs, dict(graph.mutations), graph.exported), notes


# --- rewrites that let a row group absorb its consumers ----------------------------------------
#
# Exact in real arithmetic (they re-associate sums), so results differ from eager only by
# rounding, which verification bounds like any other kernel's.

_FULL_REDUCE = {"aten.sum.default": "aten.sum.dim_IntList", "aten.mean.default": "aten.mean.dim"}


def _row_dims_upstream(graph: Graph, name: str) -> tuple[int, ...] | None:
    """Trailing reduced dims of a row reduction or row composite that `name` is computed from
    through same-shaped ops, or None."""
    shape = graph.meta(name).shape if graph.meta(name) else None
    stack, seen = [name], set()
    while stack:
        v = stack.pop()
        if v in seen or graph.is_input(v):
            continue
        seen.add(v)
        n = graph.node(v)
        if n.target in COMPOSITES | REDUCTIONS:
            spec = reduction_spec(n, graph)
            if spec and tuple(spec[0]) == tuple(shape):
                rd = spec[1]
                nd = len(shape)
                if 0 < len(rd) < nd and rd == tuple(range(nd - len(rd), nd)):
                    return rd
            continue
        if n.meta is not None and n.meta.shape == shape:
            stack.extend(i for i in n.inputs if graph.meta(i) is not None)
    return None


def _full_reduction(n: OpNode, graph: Graph) -> bool:
    """sum/mean of a tensor over all its dims to a 0-d result."""
    if n.target not in _FULL_REDUCE and n.target not in _FULL_REDUCE.values():
        return False
    if n.kwargs.get("dtype") or not n.args or not isinstance(n.args[0], Ref) or n.meta is None or n.meta.shape != ():
        return False
    return graph.meta(n.args[0].name) is not None


def split_full_reductions(graph: Graph) -> tuple[Graph, list[str]]:
    """sum(x) -> sum(sum(x, rows)) and mean(x) -> mean(mean(x, rows)) when x comes from a row
    reduction over x's trailing dims (a loss after a softmax, say): the inner reduction then joins
    that row group, so x is never written out."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    nodes, notes = [], []
    for n in graph.nodes:
        if _full_reduction(n, graph):
            x = n.args[0].name
            meta = graph.meta(x)
            rd = _row_dims_upstream(graph, x) if meta is not None and len(meta.shape) >= 2 else None
            if rd is not None:
                rows = tuple(s for i, s in enumerate(meta.shape) if i not in rd)
                mean = "mean" in n.target
                inner = OpNode(unique_name(names, f"{n.name}_rows"), "aten.mean.dim" if mean else "aten.sum.dim_IntList",
                               (Ref(x), list(rd), False), {}, [TensorMeta.dense(rows, meta.dtype)])
                outer = "aten.mean.default" if mean else "aten.sum.default"
                nodes += [inner, OpNode(n.name, outer, (Ref(inner.name),), {}, n.outs)]
                notes.append(f"{n.name}: {n.op} over all of {x} taken per row first ({inner.name}), so the row group "
                             "that computes it also reduces it")
                continue
        nodes.append(n)
    if not notes:
        return graph, []
    return _with_nodes(graph, nodes), notes


def gather_log_softmax(graph: Graph) -> tuple[Graph, list[str]]:
    """gather(log_softmax(x, d), d, i) -> gather(x, d, i) - logsumexp(x, d) when the log-softmax
    is read only by such gathers (cross-entropy): the rows are reduced once and never written."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    keep = set(graph.outputs) | set(graph.mutations)
    nodes, notes, dropped = [], [], set()
    for n in graph.nodes:
        if n.target != "aten.gather.default" or n.kwargs or len(n.args) < 3 or not isinstance(n.args[0], Ref):
            nodes.append(n)
            continue
        src = graph.producer(n.args[0])
        idx = graph.meta(n.args[2].name) if isinstance(n.args[2], Ref) else None
        if src is None or src.target != "aten._log_softmax.default" or src.name in keep or idx is None:
            nodes.append(n)
            continue
        x = src.args[0]
        xm = graph.meta(x.name)
        nd = len(xm.shape)
        d = n.args[1] % nd
        ok = (src.args[1] % nd == d and not src.args[2] and len(n.args) == 3 and len(idx.shape) == nd
              and all(graph.users(src.name) and u.target == "aten.gather.default" for u in graph.users(src.name))
              and all(i == d or a == b for i, (a, b) in enumerate(zip(idx.shape, xm.shape))))
        if not ok:
            nodes.append(n)
            continue
        row = tuple(1 if i == d else s for i, s in enumerate(xm.shape))
        rmeta = TensorMeta.dense(row, xm.dtype)
        full = TensorMeta.dense(xm.shape, xm.dtype)

        def node(base, target, args, meta):
            out = OpNode(unique_name(names, f"{n.name}_{base}"), target, args, {}, [meta])
            nodes.append(out)
            return Ref(out.name)

        mx = node("max", "aten.amax.default", (x, [d], True), rmeta)
        ex = node("exp", "aten.exp.default", (node("shift", "aten.sub.Tensor", (x, mx), full),), full)
        lse = node("lse", "aten.add.Tensor", (node("log", "aten.log.default", (
            node("sum", "aten.sum.dim_IntList", (ex, [d], True), rmeta),), rmeta), mx), rmeta)
        picked = node("pick", "aten.gather.default", (x, n.args[1], n.args[2]), n.meta)
        nodes.append(OpNode(n.name, "aten.sub.Tensor", (picked, lse), {}, n.outs))
        dropped.add(src.name)
        notes.append(f"{n.name}: gather from log_softmax {src.name} taken from its input minus the row logsumexp")
    if not notes:
        return graph, []
    read = {i for u in nodes for i in u.inputs}
    nodes = [n for n in nodes if n.name not in dropped or n.name in read]
    return _with_nodes(graph, nodes), notes


def row_rewrites(graph: Graph) -> tuple[Graph, list[str]]:
    """All rewrites that let row groups absorb their consumers, in order."""
    notes: list[str] = []
    for rewrite in (gather_log_softmax, split_full_reductions):
        graph, more = rewrite(graph)
        notes += more
    return graph, notes


def fold_scalar_tensors(graph: Graph) -> tuple[Graph, list[str]]:
    """where(c, scalar_tensor(v), y) -> where(c, v, y) (and the same for the other branch) when the
    constant has y's dtype; a scalar_tensor nobody reads any more is dropped. Saves a launch per
    constant and lets the where fuse without a tensor operand."""
    consts = {n.name: n.args[0] for n in graph.nodes if n.target == "aten.scalar_tensor.default"
              and n.args and isinstance(n.args[0], (int, float)) and not isinstance(n.args[0], bool)}
    keep = set(graph.outputs) | set(graph.mutations)
    nodes, notes = [], []
    for n in graph.nodes:
        if n.target == "aten.where.self" and n.meta is not None:
            a = list(n.args)
            for k, target in ((1, "aten.where.ScalarSelf"), (2, "aten.where.ScalarOther")):
                other = a[3 - k]
                if (isinstance(a[k], Ref) and a[k].name in consts and isinstance(other, Ref)
                        and graph.meta(a[k].name).dtype == n.meta.dtype == graph.meta(other.name).dtype):
                    notes.append(f"{n.name}: constant {a[k].name} = {consts[a[k].name]} folded into the where")
                    v = consts[a[k].name]
                    a[k] = float(v) if n.meta.dtype.startswith(("float", "bfloat")) else int(v)
                    n = OpNode(n.name, target, tuple(a), dict(n.kwargs), n.outs, n.fx)
                    break
        nodes.append(n)
    if not notes:
        return graph, []
    read = {i for u in nodes for i in u.inputs}
    nodes = [n for n in nodes if n.name not in consts or n.name in read or n.name in keep]
    return _with_nodes(graph, nodes), notes


def _fuses_over(graph: Graph, user: OpNode, shape) -> bool:
    """Whether `user` can join a group over `shape` that an add producing its input starts: an
    elementwise op, eval batch norm, or a reduction / row composite over that same domain."""
    if user.target in POINTWISE or user.target == EVAL_BN:
        return True
    if user.target in REDUCTIONS | COMPOSITES:
        spec = reduction_spec(user, graph)
        return spec is not None and tuple(spec[0]) == tuple(shape)
    return False


FULL_PRECISION = ("float32", "float64")  # result dtypes whose bias the split adds in one rounding, as the library


def split_conv_bias(graph: Graph) -> tuple[Graph, list[str]]:
    """convolution(x, w, b) -> convolution(x, w, None) + b.view(C, 1, ...) for dense (groups=1)
    convolutions. Eager adds the bias in a separate pass over the output anyway (cuDNN computes
    the convolution alone, then a broadcast add_), so the split never adds a pass: the add fuses
    into the kernel that follows (an activation, a reduction, a norm) or is a generated kernel of
    its own; when the convolution ran channels-last and its value is returned, that kernel also
    writes eager's layout (as torch.compile does). The add is the same IEEE operation, so results
    are bit-identical. Depthwise convolutions keep theirs (their template fuses the bias), and so
    does a convolution whose result is bf16 or fp16 (an autocast graph's): split, the product would
    be rounded before the bias is added, where a library that adds the bias in its own epilogue
    (the CPU's) rounds once."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    nodes, notes = [], []
    for n in graph.nodes:
        b = n.args[2] if n.target == "aten.convolution.default" and len(n.args) > 8 else None
        if not isinstance(b, Ref) or n.args[8] != 1 or n.meta is None or len(n.meta.shape) < 3 \
                or n.meta.dtype not in FULL_PRECISION \
                or graph.meta(b.name) is None or len(graph.meta(b.name).shape) != 1 \
                or n.name in graph.mutations or not (graph.users(n.name) or n.name in graph.outputs):
            nodes.append(n)
            continue
        bm, m = graph.meta(b.name), n.meta
        view_shape = (bm.shape[0],) + (1,) * (len(m.shape) - 2)
        conv = OpNode(unique_name(names, f"{n.name}_nobias"), n.target, (*n.args[:2], None, *n.args[3:]), dict(n.kwargs),
                      [m], n.fx)
        view = OpNode(unique_name(names, f"{b.name}_view"), "aten.view.default", (b, list(view_shape)), {},
                      [TensorMeta.dense(view_shape, bm.dtype)])
        nodes += [conv, view, OpNode(n.name, "aten.add.Tensor", (Ref(conv.name), Ref(view.name)), {}, n.outs)]
        fuses = n.name not in graph.outputs and all(_fuses_over(graph, u, n.meta.shape) for u in graph.users(n.name))
        notes.append(f"{n.name}: bias {b.name} added after the convolution ({conv.name})"
                     + (", fused with what follows" if fuses else ", in a generated kernel"))
    if not notes:
        return graph, []
    return _with_nodes(graph, nodes), notes


def split_addmm_bias(graph: Graph) -> tuple[Graph, list[str]]:
    """addmm(b, x, w) -> mm(x, w) + b when every consumer of the result fuses with the add (an
    activation, a row reduction, a norm over the rows): the bias add then costs nothing in the
    epilogue kernel, and the library runs a plain GEMM (as torch.compile does). A bare Linear
    whose result is returned keeps cuBLAS's bias epilogue. alpha = beta = 1 and a 1-D bias only;
    exact in real arithmetic (the GEMM's fp32 result is added to the bias once either way). A bf16
    or fp16 result (an autocast graph's Linear) keeps the bias too: cuBLAS adds it to the float32
    accumulator and rounds once, where a split would round the product first."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    nodes, notes = [], []
    for n in graph.nodes:
        b = n.args[0] if n.target == "aten.addmm.default" else None
        bm = graph.meta(b.name) if isinstance(b, Ref) else None
        if bm is None or n.meta is None or len(bm.shape) != 1 or n.kwargs.get("beta", 1) != 1 \
                or n.meta.dtype not in FULL_PRECISION \
                or n.kwargs.get("alpha", 1) != 1 or n.name in graph.outputs or n.name in graph.mutations \
                or not graph.users(n.name) \
                or not all(_fuses_over(graph, u, n.meta.shape) for u in graph.users(n.name)):
            nodes.append(n)
            continue
        mm = OpNode(unique_name(names, f"{n.name}_mm"), "aten.mm.default", tuple(n.args[1:3]), {}, [n.meta], n.fx)
        nodes += [mm, OpNode(n.name, "aten.add.Tensor", (Ref(mm.name), b), {}, n.outs)]
        notes.append(f"{n.name}: bias {b.name} added in the epilogue after a plain GEMM ({mm.name})")
    if not notes:
        return graph, []
    return _with_nodes(graph, nodes), notes


def _eval_bn_pairs(graph: Graph, roots: dict) -> list[tuple[OpNode, OpNode, OpNode, Ref, Ref | None]]:
    """(Linear, eval batch norm, its getitem 0, the Linear's weight, its bias or None) for each inference-mode batch norm whose input is
    a Linear (addmm / mm of a transposed weight) read by nothing else, its statistics and affine
    parameters and the Linear's weight and bias values of the parameters alone, where folding
    removes a pass: the batch norm's result is not fused into a following kernel anyway (then its
    affine costs nothing there), and the folded weight costs no more to recompute per call than the
    pass it removes (weight elements at most the output's). A convolution is not folded into: eager
    and the library add a convolution's bias in a pass of their own (split_conv_bias), so the
    batch norm costs nothing in that pass's kernel."""
    pairs = []
    for bn in graph.nodes:
        if bn.target != EVAL_BN or not isinstance(bn.args[0], Ref) or bn.meta is None:
            continue
        prod = None if graph.is_input(bn.args[0].name) else graph.node(bn.args[0].name)
        users = graph.users(bn.name)
        if prod is None or prod.meta is None or prod.name in graph.outputs or prod.name in graph.mutations \
                or [u.name for u in graph.users(prod.name)] != [bn.name] or bn.name in graph.outputs \
                or len(users) != 1 or users[0].target != "getitem" or users[0].args[1] != 0:
            continue
        stats = [a for a in bn.args[1:5] if a is not None]
        if not all(isinstance(a, Ref) and a.name in roots for a in stats) or bn.args[3] is None or bn.args[4] is None:
            continue
        if users[0].name not in graph.outputs and all(_fuses_over(graph, u, bn.meta.shape)
                                                     for u in graph.users(users[0].name)):
            continue  # (fused into the next kernel, the batch norm's affine is free)
        weight = _folding_weight(graph, prod)
        if weight is None or not all(isinstance(a, Ref) and a.name in roots for a in weight if a is not None):
            continue
        wm = graph.meta(weight[0].name)
        if wm is None or wm.numel > prod.meta.numel or wm.dtype != prod.meta.dtype:
            continue
        pairs.append((prod, bn, users[0], *weight))
    return pairs


def _folding_weight(graph: Graph, prod: OpNode):
    """(weight, bias or None) when `prod` is a Linear whose weight is a (N, K) parameter transposed
    by a permute; else None."""
    if prod.target in ("aten.addmm.default", "aten.mm.default"):
        b, wt = (prod.args[0], prod.args[2]) if prod.target == "aten.addmm.default" else (None, prod.args[1])
        if prod.target == "aten.addmm.default" and (prod.kwargs.get("beta", 1) != 1 or prod.kwargs.get("alpha", 1) != 1):
            return None
        if b is not None and (not isinstance(b, Ref) or graph.meta(b.name) is None or len(graph.meta(b.name).shape) != 1):
            return None
        t = graph.producer(wt)
        if t is None or t.target != "aten.permute.default" or list(t.args[1]) != [1, 0] or not isinstance(t.args[0], Ref):
            return None
        return t.args[0], b
    return None


def fold_eval_batch_norm(graph: Graph) -> tuple[Graph, list[str]]:
    """Inference-mode batch norm folded into the Linear before it (_eval_bn_pairs says where):
        s = gamma / sqrt(running_var + eps),  W' = W * s (per output feature),
        b' = (b - running_mean) * s + beta,   bn(x W^T + b) = x W'^T + b'
    (exact in real arithmetic): one GEMM with the library's bias epilogue instead of a GEMM and a
    pass for the batch norm. W' and b' are values of the parameters alone, computed from the
    live parameters and statistics on every call, so `.data` edits and `load_state_dict` are seen.
    Training-mode graphs hold no such op (their batch norm uses the batch's statistics)."""
    roots = weight_roots(graph)
    pairs = _eval_bn_pairs(graph, roots)
    if not pairs:
        return graph, []
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    by_prod = {pair[0].name: pair for pair in pairs}
    gone = {name for _, bn, item, _, _ in pairs for name in (bn.name, item.name)}
    notes: list[str] = []

    def fold(n, pair, nodes):
        def add(base, target, args, shape, dtype):
            node = OpNode(unique_name(names, base), target, tuple(args), {}, [TensorMeta.dense(tuple(shape), dtype)])
            names.add(node.name)
            nodes.append(node)
            return Ref(node.name)

        prod, bn, item, w, b = pair
        gamma, beta, mean, var, eps = bn.args[1], bn.args[2], bn.args[3], bn.args[4], bn.args[6]
        wm, dt = graph.meta(w.name), prod.meta.dtype
        c = (wm.shape[0],)
        s = add("bn_rstd", "aten.rsqrt.default",
                [add("bn_var_eps", "aten.add.Tensor", [var, eps], c, dt)], c, dt)
        if gamma is not None:
            s = add("bn_scale", "aten.mul.Tensor", [s, gamma], c, dt)
        w2 = add(f"{w.name}_folded", "aten.mul.Tensor", [w, add("bn_scale_view", "aten.view.default",
                                                                   [s, [c[0], 1]], (c[0], 1), dt)], wm.shape, dt)
        centred = add("bn_centred", "aten.sub.Tensor", [b, mean], c, dt) if b is not None else \
            add("bn_centred", "aten.neg.default", [mean], c, dt)
        b2 = add("bn_shift", "aten.mul.Tensor", [centred, s], c, dt)
        if beta is not None:
            b2 = add("bn_bias", "aten.add.Tensor", [b2, beta], c, dt)
        wt = add(f"{w.name}_folded_t", "aten.permute.default", [w2, [1, 0]], (wm.shape[1], wm.shape[0]), dt)
        x = prod.args[1] if prod.target == "aten.addmm.default" else prod.args[0]
        folded = OpNode(item.name, "aten.addmm.default", (b2, x, wt), {}, [item.meta], prod.fx)
        nodes.append(folded)
        notes.append(f"{bn.name}: inference batch norm folded into {prod.name}'s weight and bias")

    nodes = rebuilt(graph.nodes, gone, by_prod, fold)
    return _with_nodes(graph, drop_unread(graph, nodes)), notes


# elementwise ops that are non-decreasing in their first argument, also after rounding:
# target -> check of the other (constant) arguments
def _positive_scalar(n: OpNode) -> bool:
    return isinstance(n.args[1], (int, float)) and not isinstance(n.args[1], bool) and n.args[1] > 0


def _no_alpha(n: OpNode) -> bool:
    return n.kwargs.get("alpha", 1) == 1


_MONOTONE = {
    "aten.add.Tensor": _no_alpha,
    "aten.add.Scalar": _no_alpha,
    "aten.sub.Tensor": _no_alpha,
    "aten.sub.Scalar": _no_alpha,
    "aten.mul.Scalar": _positive_scalar,
    "aten.div.Scalar": _positive_scalar,
    "aten.relu.default": lambda n: True,
    "aten.clamp.default": lambda n: True,
    "aten.clamp_min.default": lambda n: True,
    "aten.clamp_max.default": lambda n: True,
    "aten.hardtanh.default": lambda n: True,
    "aten.leaky_relu.default": lambda n: len(n.args) < 2 or n.args[1] >= 0,
    # a float cast (the bf16 policy's widening of a conv result): rounding is monotone
    "aten._to_copy.default": lambda n: set(n.kwargs) == {"dtype"} and isinstance(n.kwargs["dtype"], torch.dtype)
    and n.kwargs["dtype"].is_floating_point,
}


def _monotone_step(graph: Graph, n: OpNode, pooled: int) -> str | None:
    """The input through which `n` is a non-decreasing elementwise function, if `n` is one and
    every other operand is constant over the last `pooled` dims (a scalar, a per-channel bias)."""
    if n.target not in _MONOTONE or n.meta is None or not _MONOTONE[n.target](n) or not isinstance(n.args[0], Ref):
        return None
    main = n.args[0].name
    m = graph.meta(main)
    if m is None or tuple(m.shape) != tuple(n.meta.shape) or (m.dtype != n.meta.dtype and n.op != "_to_copy") \
            or m.dtype not in ("float32", "float16", "bfloat16"):
        return None
    for a in list(n.args[1:]) + list(n.kwargs.values()):
        if isinstance(a, Ref):
            om = graph.meta(a.name)
            if om is None or a.name == main or any(d != 1 for d in om.shape[max(0, len(om.shape) - pooled):]):
                return None
    return main


def _with_dtype(m: TensorMeta, dtype: str) -> TensorMeta:
    return TensorMeta(m.shape, m.stride, dtype)


def max_pool_first(graph: Graph) -> tuple[Graph, list[str]]:
    """max_pool(f(x)) -> f(max_pool(x)) for a chain f of non-decreasing elementwise ops whose
    other operands are constant over each window (a conv's split-off bias add, a ReLU, a clamp,
    a positive scale): the max of f over a window is f of the window's max, and f then runs on
    the pooled tensor (4x smaller for a 2x2 pool) inside the kernel that follows. Exact for
    finite operands (rounding is monotone; NaN propagates through both); windows always hold an
    input element (padding <= half the window). Only when the pool's indices are not read."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    chains: dict[str, list[OpNode]] = {}  # pool name -> chain (first op first)
    moved: set[str] = set()
    by_name = {n.name: n for n in graph.nodes}
    for p in graph.nodes:
        if p.target not in POOLS or POOLS[p.target][0] != "max" or not isinstance(p.args[0], Ref) \
                or p.name in graph.outputs:
            continue
        if any(u.target != "getitem" or u.args[1] != 0 for u in graph.users(p.name)):
            continue
        chain, cur = [], p.args[0].name
        while True:
            n = by_name.get(cur)
            if n is None or cur in graph.outputs or cur in graph.mutations or len(graph.users(cur)) != 1:
                break
            src = _monotone_step(graph, n, POOLS[p.target][1])
            if src is None:
                break
            chain.insert(0, n)
            cur = src
        if chain:
            chains[p.name] = chain
            moved |= {n.name for n in chain}
    if not chains:
        return graph, []
    nodes, notes = [], []
    for n in graph.nodes:
        if n.name in moved:
            continue
        if n.target in POOLS and n.name in chains:
            src = chains[n.name][0].args[0].name  # the pool now reads this (its dtype, e.g. bf16)
            outs = [_with_dtype(n.outs[0], graph.meta(src).dtype)] + list(n.outs[1:])
            n = OpNode(n.name, n.target, (Ref(src), *n.args[1:]), dict(n.kwargs), outs, n.fx)
        elif n.target == "getitem" and isinstance(n.args[0], Ref) and n.args[0].name in chains:
            chain = chains[n.args[0].name]
            picked = OpNode(unique_name(names, f"{n.name}_max"), n.target, n.args, dict(n.kwargs),
                            [_with_dtype(n.meta, graph.meta(chain[0].args[0].name).dtype)], n.fx)
            nodes.append(picked)
            prev = picked.name
            for k, op in enumerate(chain):
                name = n.name if k == len(chain) - 1 else unique_name(names, f"{op.name}_pooled")
                meta = TensorMeta(n.meta.shape, n.meta.stride, op.meta.dtype)
                nodes.append(OpNode(name, op.target, (Ref(prev), *op.args[1:]), dict(op.kwargs), [meta]))
                prev = name
            notes.append(f"{n.args[0].name}: max pool moved before {' -> '.join(op.op for op in chain)} "
                         f"({', '.join(op.name for op in chain)})")
            continue
        nodes.append(n)
    return _with_nodes(graph, nodes), notes


def _channels_last(m: TensorMeta) -> TensorMeta:
    return TensorMeta(m.shape, channels_last_strides(m.shape), m.dtype)


_VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def _view_of_channels_last(graph: Graph, n: OpNode, names: set[str], nodes: list[OpNode],
                           restored: dict[str, str], notes: list[str]) -> OpNode:
    """A view of a value the rewrite keeps channels-last: with the strides that view really has,
    or, where no view of the channels-last tensor has its shape (instance norm's [1, N * C, H, W]
    over a conv's result), the view of a copy back in eager's layout (appended to `nodes` once
    per value)."""
    src = n.args[0].name
    m = _channels_last(graph.meta(src))
    strides = refine_strides(m.shape, m.stride, n.meta.shape)
    if strides is not None:
        return OpNode(n.name, n.target, n.args, dict(n.kwargs), [TensorMeta(n.meta.shape, strides, n.meta.dtype)],
                      n.fx)
    if src not in restored:
        back = OpNode(unique_name(names, f"{src}_contiguous"), "aten.clone.default", (Ref(src),),
                      {"memory_format": torch.contiguous_format},
                      [TensorMeta.dense(m.shape, m.dtype)])
        nodes.append(back)
        restored[src] = back.name
        notes.append(f"{back.name}: {src} copied back to the contiguous layout for {n.name}, a view channels-last "
                     "strides cannot express")
    return OpNode(n.name, n.target, (Ref(restored[src]), *n.args[1:]), dict(n.kwargs), n.outs, n.fx)


def _viewed_as_nchw(graph: Graph, conv: OpNode) -> str | None:
    """The first view no channels-last strides can express (instance norm's [1, N * C, H, W]) of
    `conv`'s result or of an elementwise value of its shape computed from it; None if there is none."""
    shape, todo, seen = tuple(conv.meta.shape), [conv.name], {conv.name}
    cl = channels_last_strides(shape)
    while todo:
        for u in graph.users(todo.pop()):
            if u.name in seen or u.meta is None:
                continue
            seen.add(u.name)
            if u.target in _VIEWS and refine_strides(shape, cl, tuple(u.meta.shape)) is None:
                return u.name
            if (u.target in POINTWISE or u.target == EVAL_BN) and tuple(u.meta.shape) == shape:
                todo.append(u.name)
    return None


# library ops whose result keeps a channels-last input's layout (as the pools do)
_CL_PRESERVING = {"aten._adaptive_avg_pool2d.default", "aten.upsample_nearest2d.default",
                  "aten.upsample_bilinear2d.default"}
# the pools whose library kernels keep a channels-last input's layout (avg_pool3d returns a contiguous result)
_CL_POOLS = {t for t in POOLS if t != "aten.avg_pool3d.default"}


def _view_of_copy(graph: Graph, n: OpNode, names: set[str], nodes: list[OpNode], restored: dict[str, str],
                  notes: list[str]) -> OpNode:
    """A view of a value whose layout the library chooses (an op the rewrite has no rule for, reading a
    channels-last value, may return either layout): the view of an explicit contiguous copy of it, which
    a view always accepts (appended to `nodes` once per value)."""
    src = n.args[0].name
    if src not in restored:
        m = graph.meta(src)
        back = OpNode(unique_name(names, f"{src}_contiguous"), "aten.clone.default", (Ref(src),),
                      {"memory_format": torch.contiguous_format},
                      [TensorMeta.dense(m.shape, m.dtype)])
        nodes.append(back)
        restored[src] = back.name
        notes.append(f"{back.name}: {src} copied to the contiguous layout for {n.name} (the library picks its layout)")
    return OpNode(n.name, n.target, (Ref(restored[src]), *n.args[1:]), dict(n.kwargs), n.outs, n.fx)


# ops that draw random numbers in the memory order of their first operand (a dropout's mask is
# drawn for empty_like(x)): they must meet it in eager's layout to draw eager's values
_RANDOM = ("aten.native_dropout.default", "aten.bernoulli.default", "aten.bernoulli.p", "aten.rand_like.default",
           "aten.randn_like.default")


def _eager_format(meta: TensorMeta | None):
    """The memory format eager's value of `meta` (as captured) has: contiguous or channels-last."""
    if meta is None:
        return None
    if meta.contiguous:
        return torch.contiguous_format
    if len(meta.shape) in (4, 5) and tuple(meta.stride) == _channels_last(meta).stride:
        return torch.channels_last if len(meta.shape) == 4 else torch.channels_last_3d
    return None


def _random_over_eager_layout(graph: Graph, n: OpNode, names: set[str], nodes: list[OpNode],
                              notes: list[str]) -> OpNode:
    """A random op (dropout) reading a value the rewrite keeps channels-last: it reads a copy in the
    layout eager gives that value instead, so its draws land on the same elements as eager's."""
    src = n.args[0].name
    m = graph.meta(src)
    back = OpNode(unique_name(names, f"{src}_eager"), "aten.clone.default", (Ref(src),),
                  {"memory_format": _eager_format(m)}, [m])
    nodes.append(back)
    notes.append(f"{back.name}: {src} copied to eager's layout for {n.name} (it draws random numbers in memory order)")
    return OpNode(n.name, n.target, (Ref(back.name), *n.args[1:]), dict(n.kwargs), n.outs, n.fx)


def channels_last_convs(graph: Graph, free: frozenset[str] = frozenset()) -> tuple[Graph, list[str]]:
    """Run float32 (or bf16) 2-D/3-D dense (groups=1) convolutions and their gradients
    (convolution_backward) channels-last and keep their results in that layout through the
    elementwise, eval batch-norm and pooling ops that follow (as torch.compile's layout optimisation
    does), and through the norms after them; group kernels walk such tensors in memory order (a
    reduction group in its input's order). `free`: returned values whose layout is this rewrite's
    choice (an AOTAutograd forward's saved tensors: the backward takes them in the strides the
    forward reports), kept channels-last like values the graph does not return.

    On the H200 cuDNN's TF32 tensor-core convolutions are ~1.7x faster on NHWC operands
    (conv_layout_probe in docs/benchmarks.md). The input and weight get one explicit
    channels-last copy each; values the model returns keep eager's layout (the kernel that computes
    them writes NCHW), so the module stays a drop-in replacement, as torch.compile's does. A
    convolution whose result is viewed in a way channels-last strides cannot express (instance
    norm's [1, N * C, H, W]) stays NCHW: its channels-last result would need a full copy back."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}
    nodes, notes = [], []
    cl: set[str] = set()
    converted: dict[str, str] = {}
    by_name = {n.name: n for n in graph.nodes}
    dead: set[str] = set()
    restored: dict[str, str] = {}  # channels-last value -> its copy in eager's layout
    unsure: set[str] = set()  # values whose layout the library picks (an op outside the rules reading a channels-last one)
    n_conv = 0

    def dense_conv(n: OpNode) -> bool:
        return (n.target == "aten.convolution.default" and n.meta is not None and n.meta.dtype in ("float32", "bfloat16")
                and len(n.meta.shape) in fmt and all(isinstance(a, Ref) for a in n.args[:2]) and n.args[8] == 1
                and all(graph.meta(a.name) is not None and len(graph.meta(a.name).shape) == len(n.meta.shape)
                        for a in n.args[:2]))

    def dense_conv_grad(n: OpNode) -> bool:
        return (n.target == "aten.convolution_backward.default" and len(n.args) > 9 and n.args[9] == 1
                and all(isinstance(a, Ref) and graph.meta(a.name) is not None
                        and graph.meta(a.name).dtype in ("float32", "bfloat16")
                        and len(graph.meta(a.name).shape) in fmt for a in n.args[:3]))

    returned = set(graph.outputs) - set(free)  # values that keep eager's layout
    # values some convolution will read through a channels-last copy of its own making
    copied = {n.args[0].name for n in graph.nodes if dense_conv(n) and _viewed_as_nchw(graph, n) is None}

    def copy_of(src: str) -> str:
        """The channels-last copy of `src` (made here, before its first reader)."""
        if src not in converted:
            m = graph.meta(src)
            nodes.append(OpNode(unique_name(names, f"{src}_cl"), "aten.clone.default", (Ref(src),),
                                {"memory_format": fmt[len(m.shape)]}, [_channels_last(m)]))
            converted[src] = nodes[-1].name
        return converted[src]

    for n in graph.nodes:
        if n.target in _CL_POOLS and n.args and isinstance(n.args[0], Ref) and n.args[0].name in copied \
                and n.args[0].name not in cl and n.name not in returned and n.meta is not None \
                and len(n.meta.shape) in fmt:
            # a pool of a value convolutions read channels-last too (an Inception module's pool
            # branch beside the convolutions of its input) reads that copy: the same values, and
            # its result comes channels-last, which the convolution after it wants (no copy of it)
            notes.append(f"{n.name}: pools {n.args[0].name}'s channels-last copy, which convolutions read too")
            n = OpNode(n.name, n.target, (Ref(copy_of(n.args[0].name)),) + tuple(n.args[1:]), dict(n.kwargs),
                       list(n.outs), n.fx)
        if dense_conv(n):
            view = _viewed_as_nchw(graph, n)
            if view is not None:
                notes.append(f"{n.name}: kept NCHW ({view} views its result as channels-last strides cannot)")
                if any(isinstance(a, Ref) and a.name in cl for a in n.args[:2]):
                    unsure.add(n.name)  # (the library convolves a channels-last input into a channels-last result)
                nodes.append(n)
                continue
            args = list(n.args)
            for k in (0, 1):
                src = args[k].name
                if src in cl:
                    continue
                if src not in converted:
                    m = graph.meta(src)
                    cast = by_name.get(src)
                    if cast is not None and plain_cast(graph, cast) and len(graph.users(src)) == 1 \
                            and src not in graph.outputs:
                        # a bf16 operand cast read only here: cast and change layout in one copy
                        conv = OpNode(unique_name(names, f"{src}_cl"), cast.target, cast.args,
                                      {**cast.kwargs, "memory_format": fmt[len(m.shape)]}, [_channels_last(m)])
                        dead.add(src)
                        nodes.append(conv)
                        converted[src] = conv.name
                    else:
                        copy_of(src)
                args[k] = Ref(converted[src])
            m = n.meta
            nodes.append(OpNode(n.name, n.target, tuple(args), dict(n.kwargs),
                                [_channels_last(m)], n.fx))
            cl.add(n.name)
            n_conv += 1
            notes.append(f"{n.name}: convolution run channels-last ({', '.join(a.name for a in args[:2])})")
            continue
        if dense_conv_grad(n):
            # grad_output, input and weight channels-last (cuDNN's NHWC kernels, as the forward's);
            # the input and weight gradients come in that layout, the getitems after keep it
            args = list(n.args)
            for k in (0, 1, 2):
                src = args[k].name
                if src not in cl and _eager_format(graph.meta(src)) is torch.contiguous_format:
                    args[k] = Ref(copy_of(src))
            outs = [_channels_last(m) if m is not None and len(m.shape) in fmt else m for m in n.outs]
            nodes.append(OpNode(n.name, n.target, tuple(args), dict(n.kwargs), outs, n.fx))
            cl.add(n.name)
            n_conv += 1
            notes.append(f"{n.name}: convolution gradients run channels-last ({', '.join(a.name for a in args[:3])})")
            continue
        if n.target in _VIEWS and n.args and isinstance(n.args[0], Ref) and n.args[0].name in cl \
                and n.meta is not None:
            n = _view_of_channels_last(graph, n, names, nodes, restored, notes)
        elif n.target in _VIEWS and n.args and isinstance(n.args[0], Ref) and n.args[0].name in unsure:
            n = _view_of_copy(graph, n, names, nodes, restored, notes)
        elif n.target in _RANDOM and n.args and isinstance(n.args[0], Ref) and n.args[0].name in cl | unsure \
                and _eager_format(graph.meta(n.args[0].name)) is not None:
            n = _random_over_eager_layout(graph, n, names, nodes, notes)
        keeps = (n.target in POINTWISE and n.meta is not None and len(n.meta.shape) in fmt
                 and any(i in cl and graph.meta(i).shape == n.meta.shape for i in n.inputs))
        # pooling in the library keeps a channels-last input's layout (NHWC kernels), so do its
        # outputs and the getitems that pick them
        # (avg_pool3d has no channels-last kernel: it returns a contiguous result)
        keeps = keeps or (n.target in _CL_POOLS and n.inputs and (n.inputs[0] in cl or n.inputs[0] in converted.values()))
        keeps = keeps or (n.target in _CL_PRESERVING and n.inputs and n.inputs[0] in cl)
        keeps = keeps or (n.target == EVAL_BN and n.inputs and n.inputs[0] in cl)  # elementwise
        # norms over a channels-last input: the fused norm kernel reads it in memory order and
        # writes its result channels-last too (values the model returns excepted, below)
        keeps = keeps or (n.target in NORMS and n.inputs and n.inputs[0] in cl)
        keeps = keeps or (n.target == "getitem" and n.args[0].name in cl and n.meta is not None
                          and len(n.meta.shape) in fmt)
        if not keeps and n.target not in _VIEWS and any(i in cl or i in unsure for i in n.inputs):
            unsure.add(n.name)  # computed by the library from a channels-last value: its layout is the library's
        if keeps and n.name not in graph.mutations and n.name not in returned:
            outs = [_channels_last(m) if m is not None and len(m.shape) in fmt
                    else m for m in n.outs]
            n = OpNode(n.name, n.target, n.args, dict(n.kwargs), outs, n.fx)
            cl.add(n.name)
        nodes.append(n)
    if not n_conv:
        return graph, notes
    nodes = [n for n in nodes if n.name not in dead]
    notes.append(f"channels-last layout kept through {len(cl) - n_conv} elementwise and pooling values after the "
                 "convolutions")
    return _with_nodes(graph, nodes), notes


def saved_copies(graph: Graph, free: tuple[int, ...]) -> tuple[Graph, list[str]]:
    """At the positions `free` (returned values whose layout the rewrites choose), an input the graph
    also copies channels-last for a convolution is returned as that copy: the same values, and
    whatever reads the returned value (an AOTAutograd backward reading the saved input of a
    convolution) need not copy it again."""
    copies = {n.args[0].name: n.name for n in graph.nodes
              if n.target == "aten.clone.default" and len(n.args) == 1 and isinstance(n.args[0], Ref)
              and graph.is_input(n.args[0].name) and set(n.kwargs) == {"memory_format"}
              and n.kwargs["memory_format"] in (torch.channels_last, torch.channels_last_3d)}
    outputs, notes = list(graph.outputs), []
    for i in free:
        if i < len(outputs) and outputs[i] in copies:
            notes.append(f"output {i}: {outputs[i]} returned as its channels-last copy {copies[outputs[i]]}")
            outputs[i] = copies[outputs[i]]
    if not notes:
        return graph, notes
    return Graph(graph.name, graph.inputs, graph.nodes, outputs, dict(graph.mutations), graph.exported), notes


def free_names(graph: Graph, free: tuple[int, ...]) -> frozenset[str]:
    """The values returned only at the positions `free` (a value also returned elsewhere keeps
    eager's layout there, so everywhere); inputs excluded (returned as they come)."""
    at = {o for i, o in enumerate(graph.outputs) if i in free and not graph.is_input(o)}
    return frozenset(at - {o for i, o in enumerate(graph.outputs) if i not in free})


# tensor-core ops and the argument positions of their tensor operands
_TENSOR_CORE_OPS = {"aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.addmm.default": (0, 1, 2),
                    "aten.baddbmm.default": (0, 1, 2), "aten.convolution.default": (0, 1, 2), SDPA: (0, 1, 2)}


def _cast(name: str, src: str, meta: TensorMeta, dtype: torch.dtype) -> OpNode:
    return OpNode(name, "aten._to_copy.default", (Ref(src),), {"dtype": dtype},
                  [TensorMeta(meta.shape, meta.stride, str(dtype).replace("torch.", ""))])


def plain_cast(graph: Graph, n: OpNode) -> bool:
    """A float-to-float `_to_copy` that changes nothing but the dtype."""
    src = graph.meta(n.args[0].name) if n.args and isinstance(n.args[0], Ref) else None
    return (n.target == "aten._to_copy.default" and set(n.kwargs) == {"dtype"} and src is not None
            and src.dtype in ("float32", "float16", "bfloat16") and n.meta is not None
            and n.meta.dtype in ("float32", "float16", "bfloat16"))


def bf16_operands(graph: Graph) -> tuple[Graph, list[str]]:
    """The bf16 policy made explicit: every float32 GEMM and convolution (dense, grouped or
    depthwise) reads bf16 copies of its tensor operands and accumulates in float32 (cuBLAS / cuDNN /
    the depthwise template), as torch.autocast does for the baselines; its bf16 result is widened
    back to float32 under the op's own name, so what follows computes in float32 as in the model and
    the module returns the model's dtypes. The casts are elementwise: an operand's cast fuses into
    the kernel that produces it (which then writes half the bytes), the widening into the kernel
    that reads the result."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    nodes, notes = [], []
    narrowed: dict[str, str] = {}
    for n in graph.nodes:
        idx = _TENSOR_CORE_OPS.get(n.target)
        refs = [n.args[k] for k in idx or () if k < len(n.args) and isinstance(n.args[k], Ref)]
        if idx is None or n.meta is None or n.meta.dtype != "float32" or len(n.outs) != 1 \
                or any(graph.meta(r.name) is None or graph.meta(r.name).dtype != "float32" for r in refs):
            nodes.append(n)
            continue
        args = list(n.args)
        for k in idx:
            if k < len(args) and isinstance(args[k], Ref):
                src = args[k].name
                if src not in narrowed:
                    cast = _cast(unique_name(names, f"{src}_bf16"), src, graph.meta(src), torch.bfloat16)
                    nodes.append(cast)
                    narrowed[src] = cast.name
                args[k] = Ref(narrowed[src])
        low = OpNode(unique_name(names, f"{n.name}_bf16"), n.target, tuple(args), dict(n.kwargs),
                     [TensorMeta(n.meta.shape, n.meta.stride, "bfloat16")], n.fx)
        nodes += [low, _cast(n.name, low.name, n.meta, torch.float32)]
        notes.append(f"{n.name}: {n.op} on bf16 operands ({', '.join(narrowed[r.name] for r in refs)}), "
                     "fp32 accumulation, result widened to float32")
    if not notes:
        return graph, []
    return _with_nodes(graph, nodes), notes


def bf16_outputs(graph: Graph, dtypes: list[torch.dtype | None]) -> tuple[Graph, list[str]]:
    """Under the bf16 policy the module returns what the eager baseline returns in bf16 autocast:
    a float32 output that eager returns as bf16 (a conv / GEMM result and the elementwise ops after
    it) is rounded to bf16 once at the end (the cast fuses into the kernel that computes it, which
    then writes half the bytes). `dtypes`: eager-under-autocast dtype of each output, in order."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    nodes, outputs, notes, widened = list(graph.nodes), list(graph.outputs), [], set()
    for k, (out, want) in enumerate(zip(graph.outputs, dtypes)):
        meta = graph.meta(out)
        if want != torch.bfloat16 or graph.is_input(out) or meta is None or meta.dtype != "float32" \
                or out in graph.mutations:
            continue
        node = graph.node(out)
        src = node.args[0].name if plain_cast(graph, node) else None
        if src is not None and graph.meta(src).dtype == "bfloat16":  # a widened bf16 result: return it
            outputs[k] = src
            widened.add(out)  # the widening itself is dropped below if nothing else reads it
        else:
            cast = _cast(unique_name(names, f"{out}_bf16"), out, meta, torch.bfloat16)
            nodes.append(cast)
            outputs[k] = cast.name
        notes.append(f"{out}: returned as bf16, as eager returns it under bf16 autocast")
    if not notes:
        return graph, []
    out = Graph(graph.name, graph.inputs, nodes, outputs, dict(graph.mutations), graph.exported)
    if widened:
        out = Graph(graph.name, graph.inputs, drop_unread(out, nodes, among=widened), outputs,
                    dict(graph.mutations), graph.exported)
    return out, notes


def _copies(n: OpNode) -> bool:
    """A copy whose values are its input's, moved (`x.contiguous()`, a repeat's `clone`)."""
    return n.target == "aten.clone.default" and set(n.kwargs) <= {"memory_format"}


def _movable(n: OpNode) -> bool:
    """A view or copy of its first operand with no other tensor or dtype argument: the same op
    applies to a bf16 twin of that operand (a view with a dtype reinterprets bits, so it does not)."""
    return (is_view(n) or _copies(n)) and bool(n.args) and isinstance(n.args[0], Ref) and not any(
        isinstance(a, (Ref, torch.dtype)) for a in list(n.args[1:]) + list(n.kwargs.values()))


def narrow_through_views(graph: Graph) -> tuple[Graph, list[str]]:
    """A bf16 value widened to float32, viewed or copied (reshaped, permuted, split, made
    contiguous) and cast back to bf16 is those views and copies of the bf16 value: exact (widening
    then narrowing is the identity), and the two casts and their memory traffic disappear (e.g.
    attention's q, k, v taken from a bf16 projection, and its bf16 result transposed and fed to the
    next projection). A float32 value computed in the graph, copied and then narrowed (a
    grouped-query attention's keys repeated for every head; a packed projection's q, k and v made
    contiguous and cast for the attention) is narrowed before its first copy where every use of it
    ends in a cast to bf16: the copies move half the bytes, and the cast fuses into the kernel that
    computes the value or into the first copy. Values left unread are dropped after."""
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    copied: dict[str, str] = {}  # float32 view -> its bf16 twin
    new_nodes: dict[str, list[OpNode]] = {}  # inserted before the node named
    mapping: dict[str, str] = {}
    notes = []

    def twin(name: str) -> str | None:
        """The bf16 twin of float32 value `name` (views of a widened bf16 value), else None."""
        if name in copied:
            return copied[name]
        if graph.is_input(name):
            return None
        n = graph.node(name)
        if plain_cast(graph, n) and n.meta.dtype == "float32" and graph.meta(n.args[0].name).dtype == "bfloat16":
            return n.args[0].name
        if not _movable(n):
            return None
        src = twin(n.args[0].name)
        if src is None:
            return None
        copy = OpNode(unique_name(names, f"{name}_bf16v"), n.target, (Ref(src),) + tuple(n.args[1:]), dict(n.kwargs),
                      [None if m is None else _with_dtype(m, "bfloat16") for m in n.outs], n.fx)
        new_nodes.setdefault(name, []).append(copy)
        copied[name] = copy.name
        return copy.name

    order = {n.name: k for k, n in enumerate(graph.nodes)}
    readers = consumers(graph)
    narrows: dict[str, bool] = {}

    def narrow_only(name: str) -> bool:
        """Whether every use of float32 `name` ends, through views and copies, in a cast to bf16."""
        if name not in narrows:
            users = readers.get(name, [])
            narrows[name] = bool(users) and name not in graph.outputs and name not in graph.mutations and all(
                (plain_cast(graph, u) and u.meta.dtype == "bfloat16") or (_movable(u) and narrow_only(u.name))
                for u in users)
        return narrows[name]

    def narrowed_first(name: str) -> str | None:
        """The bf16 twin of `name` built by narrowing the float32 value that its views and copies
        start from, just above the first copy, where every use of that value and of the copies
        ends in a cast to bf16 (a packed projection's q, k and v, each cast for the attention)."""
        cur, above = name, None
        while not graph.is_input(cur) and _movable(graph.node(cur)) and narrow_only(graph.node(cur).args[0].name):
            n = graph.node(cur)
            cur = n.args[0].name
            if _copies(n):
                above = cur
        if above is None or graph.meta(above).dtype != "float32":
            return None
        cast = _cast(unique_name(names, f"{above}_bf16"), above, graph.meta(above), torch.bfloat16)
        new_nodes.setdefault(min((u.name for u in readers[above]), key=order.get), []).insert(0, cast)
        copied[above] = cast.name
        return twin(name)

    for n in graph.nodes:
        if plain_cast(graph, n) and n.meta.dtype == "bfloat16" and n.name not in graph.outputs \
                and n.name not in graph.mutations and graph.meta(n.args[0].name).dtype == "float32":
            src = twin(n.args[0].name)
            if src is not None and src != n.args[0].name:
                mapping[n.name] = src
                notes.append(f"{n.name}: {src}, the same views of the bf16 value (no float32 round trip)")
                continue
            src = narrowed_first(n.args[0].name)
            if src is not None:
                mapping[n.name] = src
                notes.append(f"{n.name}: {src}, narrowed before its copies (they move bf16)")
    if not notes:
        return graph, []
    nodes = []
    for n in graph.nodes:
        nodes += new_nodes.get(n.name, [])
        if n.name not in mapping:
            nodes.append(reading(n, mapping))
    return _with_nodes(graph, drop_unread(graph, nodes)), notes


def dedupe(graph: Graph) -> tuple[Graph, list[str]]:
    """Common subexpressions: a node that repeats an earlier node's op on the same arguments (e.g.
    cross-entropy's three `target != ignore_index` masks) reads the earlier value instead. Random,
    allocating and in-place ops are never merged, nor values the model returns or buffers it updates."""
    seen: dict[str, str] = {}

    def find(n):
        if not pure(n.target):
            return None
        key = repr((n.target, n.args, sorted(n.kwargs.items()), n.outs))
        if key in seen:
            return seen[key], f"{n.name}: same as {seen[key]}"
        seen[key] = n.name
        return None

    return _forward_values(graph, find)


def rewrite(graph: Graph, policy: str = "fp32", out_dtypes: list[torch.dtype | None] | None = None,
            algebra: bool = True, recompute: bool = False, free: tuple[int, ...] = (),
            view_outputs: bool = True) -> tuple[Graph, list[str]]:
    """Every rewrite optimize applies before planning. Exact ones first: casts named by their dtype
    alone, no-ops out, constants folded, repeated subexpressions merged, decomposed activations as
    one op (plan.recompose), the algebra rules of plan.algebra (reductions over size-1 dims,
    through affine ops, of matrix products and of convolutions; `algebra=False`, the command line's --no-rewrites, leaves them
    out), inference batch norms folded into the Linear before them,
    convolution and GEMM biases split off, max pools moved
    before non-decreasing elementwise ops, row rewrites, instance norms over their own dims, by-hand attention as one fused call (fp32 and
    bf16; tf32 when causally masked: plan.attention). Then the policy's: under bf16 explicit
    bf16 operands for GEMMs and convolutions (the rounding the policy allows); elementwise work over
    a concatenation done per piece (plan.pieces); under the tensor-core policies (tf32, bf16)
    channels-last convolutions. Last, training batch norms, layer
    norms and group norms that feed a pool split into statistics and a pointwise apply (plan.norm_split), and with
    `recompute`, cheap elementwise values a reduction kernel would store for another kernel computed
    again by that kernel (plan.recompute). `out_dtypes` (bf16
    only): the dtypes eager returns under the policy's autocast (bf16_outputs). `free`: positions of
    the returned values whose layout the rewrites choose (channels_last_convs, saved_copies).
    `view_outputs`: a returned copy may become a view of the value copied (simplify)."""
    notes: list[str] = []
    def simplify_(g):
        return simplify(g, view_outputs)

    steps = [dtype_only_casts, simplify_, fold_scalar_tensors, dedupe, recompose_mish] + ([exact_algebra] if algebra else []) + [
        fold_eval_batch_norm, split_conv_bias, split_addmm_bias, max_pool_first, row_rewrites, instance_norm_rows]
    if policy in ATTENTION_POLICIES:  # under tf32 causal-masked attention only (plan.attention)
        steps += [lambda g: attention(g, policy), simplify_]
    if policy == "bf16":  # then pools move before the widening casts too (they pool bf16 values)
        steps += [bf16_operands, narrow_through_views, max_pool_first]
        if out_dtypes:
            steps.append(lambda g: bf16_outputs(g, out_dtypes))
    steps += [compute_by_pieces, dedupe]  # (after the policy's casts, which it moves into the pieces too;
    # then one of each slice it made of a value, e.g. a cos table's halves for q and for k)
    if policy in ("tf32", "bf16"):
        steps += [lambda g: channels_last_convs(g, free_names(g, free)), lambda g: saved_copies(g, free)]
    steps.append(split_norms_before_pools)  # (in the layouts chosen above)
    if recompute:
        steps.append(recompute_reads)  # (last: it plans the graph the steps above made)
    for step in steps:
        graph, more = step(graph)
        notes += more
    return graph, notes
