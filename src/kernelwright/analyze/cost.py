"""FLOPs and minimum bytes of one captured node.

FLOP conventions (a multiply-add counts 2; every count is per node, as ATen would run it):

- gemm: 2·M·N·K, times the batch for bmm/baddbmm/matmul; a fused bias (addmm, baddbmm,
  addmv, linear with bias) adds one FLOP per output element. (`addmm` = 2·M·N·K + M·N.)
- conv: 2·N·Cout·prod(out spatial)·(Cin/groups)·prod(kernel); transposed convolutions count the
  same product with respect to the *input* spatial size: 2·N·Cin·prod(in spatial)·(Cout/groups)
  ·prod(kernel). A bias adds one FLOP per output element.
- pointwise: 1 per output element, transcendental functions (exp, tanh, erf, ...) included —
  on the GPU they are a few instructions, and pointwise ops are memory-bound anyway. Casts,
  fills and dropout-in-eval count 0.
- reduction: 1 per input element (sum, mean, amax, argmax, prod, ...); var/std (and their _mean
  variants) 3 (subtract, square, add); vector norms 2 (square, add); logsumexp 4 (max, subtract,
  exp, add).
- normalization, per element: softmax and log_softmax 5 (max, subtract, exp, sum, divide/log);
  layer, group, instance and training-mode batch norm 7 (sum, subtract, square, sum for the
  statistics, scale by rstd, affine multiply and add); eval-mode batch norm 4 (statistics are
  given); RMS norm 4 (square, sum, scale, weight).
- pooling: window size per output element (adaptive pooling: the largest bin, ceil(in/out) per dim).
- scan: 1 per element (logcumsumexp 3).
- data movement and other: 0.

Minimum bytes: every distinct tensor a node reads is read once and every output it produces is
written once, at the graph's dtypes. Broadcast (stride-0) dimensions are not counted: an
expanded bias reads only its own elements. Outputs of multi-output ops that no node consumes
(the indices of a max-pool, the saved mean of a layer norm in inference) are not counted.
View-creating data movement (view, permute, expand, slice, select, getitem, ...) moves 0 bytes;
copies (clone, cat, _to_copy, gather, pad, ...) read their input and write their output.
Gathers (embedding, index, gather, index_select) read at most as many source elements as they
write.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.analyze.classify import is_view, op_class
from kernelwright.capture.graph import Graph, OpNode, Ref, TensorMeta


@dataclass(frozen=True)
class NodeCost:
    flops: int
    bytes: int
    read_bytes: int = 0
    write_bytes: int = 0


ZERO = NodeCost(0, 0, 0, 0)

_NO_FLOP_POINTWISE = frozenset({"_to_copy", "to", "type_as", "fill", "full_like", "zeros_like",
                                "ones_like", "native_dropout", "dropout", "positive"})
_NO_WRITE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                       "empty_permuted"})
_GATHERS = frozenset({"embedding", "index", "index_select", "gather", "masked_select"})

_REDUCTION_PER_ELEMENT = {"var": 3, "var_mean": 3, "std": 3, "std_mean": 3, "linalg_vector_norm": 2,
                          "norm": 2, "frobenius_norm": 2, "logsumexp": 4}
_NORM_PER_ELEMENT = {"_softmax": 5, "_log_softmax": 5, "softmax": 5, "log_softmax": 5,
                     "_safe_softmax": 5, "_native_batch_norm_legit_no_training": 4,
                     "_batch_norm_no_update": 4, "rms_norm": 4, "_fused_rms_norm": 4,
                     "local_response_norm": 6}
_NORM_DEFAULT = 7
_SCAN_PER_ELEMENT = {"logcumsumexp": 3, "_logcumsumexp": 3}


def distinct_elements(meta: TensorMeta) -> int:
    """Elements a tensor really occupies: broadcast (stride-0) dimensions count once."""
    n = 1
    for size, stride in zip(meta.shape, meta.stride):
        if size == 0:
            return 0
        if stride != 0:
            n *= size
    return n


def min_bytes(meta: TensorMeta | None) -> int:
    return 0 if meta is None else distinct_elements(meta) * meta.itemsize


def _meta_of(graph: Graph, name: str) -> TensorMeta | None:
    try:
        return graph.meta(name)
    except KeyError:
        return None


def _meta(graph: Graph, arg) -> TensorMeta | None:
    return _meta_of(graph, arg.name) if isinstance(arg, Ref) else None


def _arg(node: OpNode, i: int, name: str | None = None, default=None):
    if i < len(node.args):
        return node.args[i]
    if name is not None and name in node.kwargs:
        return node.kwargs[name]
    return default


def consumers(graph: Graph) -> dict[str, list[OpNode]]:
    """Map from a value's name to the nodes that read it (one pass over the graph)."""
    out: dict[str, list[OpNode]] = {}
    for n in graph.nodes:
        for name in n.inputs:
            out.setdefault(name, []).append(n)
    return out


def _used_outputs(node: OpNode, graph: Graph, users: dict[str, list[OpNode]] | None) -> list[TensorMeta]:
    tensors = [(i, m) for i, m in enumerate(node.outs) if m is not None]
    if len(tensors) <= 1 or node.target == "getitem":
        return [m for _, m in tensors]
    readers = users.get(node.name, []) if users is not None else graph.users(node.name)
    picked: set[int] = set()
    for u in readers:
        if u.target == "getitem" and len(u.args) >= 2 and isinstance(u.args[1], int):
            picked.add(u.args[1])
        else:  # consumed whole: every output is needed
            picked.update(i for i, _ in tensors)
    if node.name in graph.outputs:
        picked.update(i for i, _ in tensors)
    if not picked:
        picked.add(tensors[0][0])
    return [m for i, m in tensors if i in picked]


# ---------------------------------------------------------------- FLOPs per class

def _gemm_flops(node: OpNode, graph: Graph) -> int:
    op = node.op
    out = node.meta
    if out is None:
        return 0
    n_out = out.numel
    if op in ("mm", "bmm", "matmul", "mv", "dot", "vdot"):
        a = _meta(graph, _arg(node, 0))
        return 2 * n_out * (a.shape[-1] if a and a.shape else 0)
    if op in ("addmm", "baddbmm", "addmv", "_addmm_activation"):
        a = _meta(graph, _arg(node, 1))
        extra = 2 * n_out if op == "_addmm_activation" else n_out
        return 2 * n_out * (a.shape[-1] if a and a.shape else 0) + extra
    if op == "addbmm":
        a = _meta(graph, _arg(node, 1))
        if a is None or len(a.shape) != 3:
            return 0
        return 2 * a.shape[0] * n_out * a.shape[-1] + n_out
    if op == "linear":
        x = _meta(graph, _arg(node, 0))
        bias = _arg(node, 2, "bias")
        return 2 * n_out * (x.shape[-1] if x and x.shape else 0) + (n_out if isinstance(bias, Ref) else 0)
    if op.startswith("scaled_dot_product") or op.startswith("_scaled_dot_product"):
        q, k, v = (_meta(graph, _arg(node, i)) for i in range(3))
        if not (q and k and v):
            return 0
        rows = q.numel // q.shape[-1]  # batch * heads * L
        s = k.shape[-2]
        return 2 * rows * s * q.shape[-1] + 2 * rows * s * v.shape[-1] + 5 * rows * s
    return 0  # einsum, bilinear: not counted


_TRANSPOSED_CONV = frozenset({"conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                              "cudnn_convolution_transpose", "slow_conv_transpose2d",
                              "slow_conv_transpose3d"})


def conv_is_transposed(node: OpNode) -> bool:
    if node.op in _TRANSPOSED_CONV:
        return True
    if node.op in ("convolution", "_convolution", "convolution_overrideable"):
        return bool(_arg(node, 6, "transposed", False))
    return False


def _conv_flops(node: OpNode, graph: Graph) -> int:
    x = _meta(graph, _arg(node, 0))
    w = _meta(graph, _arg(node, 1))
    out = node.meta
    if x is None or w is None or out is None or len(w.shape) < 3:
        return 0
    kernel = math.prod(w.shape[2:])
    bias = _arg(node, 2, "bias")
    bias_flops = out.numel if isinstance(bias, Ref) else 0
    if conv_is_transposed(node):
        # weight: (Cin, Cout/groups, *k); every input element scatters into Cout/groups * k outputs
        return 2 * x.numel * w.shape[1] * kernel + bias_flops
    # weight: (Cout, Cin/groups, *k); every output element gathers Cin/groups * k inputs
    return 2 * out.numel * w.shape[1] * kernel + bias_flops


def _first_tensor_input(node: OpNode, graph: Graph) -> TensorMeta | None:
    for name in node.inputs:
        m = _meta_of(graph, name)
        if m is not None:
            return m
    return None


def _spatial_dims(op: str) -> int | None:
    for d in (1, 2, 3):
        if f"{d}d" in op:
            return d
    return None


def _pool_window(node: OpNode, graph: Graph) -> int:
    op = node.op
    x = _meta(graph, _arg(node, 0))
    out = node.meta
    nd = _spatial_dims(op) or 2
    if "adaptive" in op:
        if x is None or out is None:
            return 1
        win = 1
        for i in range(1, nd + 1):
            o = out.shape[-i]
            win *= math.ceil(x.shape[-i] / o) if o else 0
        return win
    ks = _arg(node, 1, "kernel_size")
    if isinstance(ks, int):
        ks = [ks]
    if not isinstance(ks, (list, tuple)) or not ks:
        return 1
    ks = list(ks)
    if len(ks) == 1 and nd > 1:
        ks = ks * nd
    return math.prod(int(k) for k in ks)


def node_flops(node: OpNode, graph: Graph, cls: str | None = None) -> int:
    cls = cls or op_class(node)
    out = node.meta
    if cls == "gemm":
        return _gemm_flops(node, graph)
    if cls == "conv":
        return _conv_flops(node, graph)
    if out is None:
        return 0
    if cls == "pointwise":
        return 0 if node.op.rstrip("_") in _NO_FLOP_POINTWISE else out.numel
    if cls == "reduction":
        x = _first_tensor_input(node, graph)
        return (x.numel if x else 0) * _REDUCTION_PER_ELEMENT.get(node.op, 1)
    if cls == "normalization":
        return out.numel * _NORM_PER_ELEMENT.get(node.op, _NORM_DEFAULT)
    if cls == "pooling":
        return out.numel * _pool_window(node, graph)
    if cls == "scan":
        return out.numel * _SCAN_PER_ELEMENT.get(node.op, 1)
    return 0


# ---------------------------------------------------------------- bytes

def node_bytes(node: OpNode, graph: Graph, users: dict[str, list[OpNode]] | None = None) -> tuple[int, int]:
    """(read bytes, write bytes) of a node, by the rules in the module docstring."""
    if is_view(node) or all(m is None for m in node.outs):
        return 0, 0
    outs = _used_outputs(node, graph, users)
    write = 0 if node.op in _NO_WRITE else sum(min_bytes(m) for m in outs)
    read = 0
    if node.op in _GATHERS:
        # the source (first tensor argument for gather/index/index_select, the table for
        # embedding) is read only where gathered; index tensors are read whole
        source = node.inputs[0] if node.inputs else None
        out_elems = sum(distinct_elements(m) for m in outs)
        for name in node.inputs:
            m = _meta_of(graph, name)
            if m is None:
                continue
            b = min_bytes(m)
            if name == source:
                b = min(b, out_elems * m.itemsize)
            read += b
        return read, write
    for name in node.inputs:
        read += min_bytes(_meta_of(graph, name))
    return read, write


def node_cost(node: OpNode, graph: Graph, users: dict[str, list[OpNode]] | None = None) -> NodeCost:
    """FLOPs and minimum bytes of `node` (see the module docstring for the conventions).

    `users` (from `consumers(graph)`) avoids a scan of the graph per multi-output node.
    """
    cls = op_class(node)
    if is_view(node):
        return ZERO
    read, write = node_bytes(node, graph, users)
    return NodeCost(int(node_flops(node, graph, cls)), read + write, read, write)


def graph_cost(graph: Graph) -> NodeCost:
    """FLOPs and minimum bytes of a whole graph: the sums of `node_cost` over its nodes (each node
    run on its own, as ATen runs it; the `flops` and `bytes` totals of analyze)."""
    users = consumers(graph)
    flops = read = write = 0
    for node in graph.nodes:
        c = node_cost(node, graph, users)
        flops, read, write = flops + c.flops, read + c.read_bytes, write + c.write_bytes
    return NodeCost(flops, read + write, read, write)
