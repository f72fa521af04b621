"""A convolution-epilogue candidate that is one library call: cuDNN's fused convolution + bias (+
residual) + ReLU, through `torch.cudnn_convolution_relu` / `torch.cudnn_convolution_add_relu`.

It applies when the group reading a (dense or grouped, not transposed) float32 convolution is,
in order: an optional per-channel bias add, an optional inference batch norm, an optional add of a
tensor of the output's shape (a residual), then ReLU, and nothing else. The batch norm is folded
into the convolution's weight and bias on every call, from the live parameters and statistics
(w' = w * g / sqrt(var + eps), b' = (b - mean) * g / sqrt(var + eps) + beta), so the call stays
right after the user edits them; the fold costs two small kernels over the weight per call.

Not a generated kernel: the chain rewritten onto one library call, verified and timed like every
other candidate, so it ships only when measured faster than the library convolution followed by
the epilogue kernel and than the Triton convolution. Without CUDA (the interpreter tests) the same
folded weights run through aten.convolution + ReLU, which checks the folding.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.templating import triton_template
from kernelwright.ops import EVAL_BN
from kernelwright.space.config import Config

NAME = "torch.cudnn_conv_relu"


@dataclass(frozen=True)
class Chain:
    bias: str | None  # graph value of the per-channel bias ([C] or [C, 1, ...]): the conv's own, or added after it
    bn: tuple | None  # (weight, bias, running_mean, running_var, eps) of the folded batch norm
    residual: str | None  # graph value added before the ReLU
    out: str  # the group's output (the ReLU)
    ops: tuple[str, ...]  # the matched ops, for the module's docstring


def _per_channel(graph: Graph, v, C: int) -> bool:
    m = graph.meta(v.name) if isinstance(v, Ref) else None
    return m is not None and m.dtype == "float32" and m.shape[:1] == (C,) and all(s == 1 for s in m.shape[1:])


def match(graph: Graph, conv: OpNode, group_nodes: list[str], group_outputs: list[str]) -> Chain | str:
    """The chain this candidate computes, or why it does not apply."""
    if conv.meta is None or conv.meta.dtype != "float32" or bool(conv.args[6]):
        return "float32 convolutions (not transposed) only"
    shape, C = tuple(conv.meta.shape), conv.meta.shape[1]
    bias = bn = residual = None
    if conv.args[2] is not None:
        if not _per_channel(graph, conv.args[2], C):
            return "the convolution's bias is not a per-channel float32 tensor"
        bias = conv.args[2].name
    nodes = [graph.node(n) for n in group_nodes]
    prev, i, ops = conv.name, 0, []

    def other(n: OpNode):
        """The operand of a two-argument add besides `prev`, or None."""
        if n.target != "aten.add.Tensor" or n.kwargs or len(n.args) != 2:
            return None
        a, b = n.args
        return b if isinstance(a, Ref) and a.name == prev else a if isinstance(b, Ref) and b.name == prev else None

    if bias is None and i < len(nodes) and _per_channel(graph, other(nodes[i]), C):
        bias, prev, i = other(nodes[i]).name, nodes[i].name, i + 1
        ops.append("add bias")
    if i + 1 < len(nodes) and nodes[i].target == EVAL_BN and isinstance(nodes[i].args[0], Ref) \
            and nodes[i].args[0].name == prev and nodes[i + 1].target == "getitem" and nodes[i + 1].args[1] == 0:
        w, b, rm, rv = nodes[i].args[1:5]
        if not all(v is None or _per_channel(graph, v, C) for v in (w, b)) \
                or not all(_per_channel(graph, v, C) for v in (rm, rv)):
            return "the batch norm's parameters are not per-channel float32 tensors"
        bn = tuple(v.name if isinstance(v, Ref) else None for v in (w, b, rm, rv)) + (float(nodes[i].args[6]),)
        prev, i = nodes[i + 1].name, i + 2
        ops.append("batch norm (folded)")
    if i < len(nodes):
        z = other(nodes[i])
        zm = graph.meta(z.name) if isinstance(z, Ref) else None
        if zm is not None and tuple(zm.shape) == shape and zm.dtype == "float32":
            residual, prev, i = z.name, nodes[i].name, i + 1
            ops.append("add residual")
    if i == len(nodes) or nodes[i].target != "aten.relu.default" or nodes[i].kwargs or len(nodes[i].args) != 1 \
            or not isinstance(nodes[i].args[0], Ref) or nodes[i].args[0].name != prev:
        return "the epilogue does not end in ReLU after a bias, batch norm or residual add"
    prev, i = nodes[i].name, i + 1
    ops.append("relu")
    if i != len(nodes) or list(group_outputs) != [prev]:
        return "the epilogue has more than bias, batch norm, residual add and ReLU"
    return Chain(bias, bn, residual, prev, tuple(ops))


def config() -> Config:
    return Config.make(NAME, epilogue="relu")


def render(graph: Graph, conv: OpNode, chain: Chain, x: str, name: str) -> tuple[str, list[str]]:
    """Module text whose `launch(*inputs)` runs the chain as one cuDNN call; and its inputs (`x`:
    the value the convolution reads)."""
    bn = chain.bn or (None, None, None, None, 0.0)
    values = [x, conv.args[1].name, chain.bias, *bn[:4], chain.residual]
    ins = list(dict.fromkeys(v for v in values if v is not None))
    arg = {v: f"a{k}" for k, v in enumerate(ins)}
    out = graph.meta(chain.out)
    _, _, _, stride, padding, dilation, _, _, groups = conv.args
    text = triton_template("cudnn_conv_relu.py.j2").render(
        name=name, conv=conv.name, ops=" -> ".join(chain.ops), args=[arg[v] for v in ins], inputs=ins,
        out=chain.out, x=arg[x], w=arg[conv.args[1].name], bias=arg.get(chain.bias),
        bn_w=arg.get(bn[0]), bn_b=arg.get(bn[1]), bn_mean=arg.get(bn[2]), bn_var=arg.get(bn[3]), eps=bn[4],
        has_bn=chain.bn is not None, residual=arg.get(chain.residual), nd=len(out.shape) - 2,
        stride=list(stride), padding=list(padding), dilation=list(dilation), groups=int(groups),
        out_stride=repr(tuple(out.stride)))
    return text, ins


__all__ = ["NAME", "Chain", "match", "config", "render"]
