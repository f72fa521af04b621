"""A GEMM-epilogue candidate that is one library call: cuBLASLt's fused bias + ReLU epilogue,
through `torch._addmm_activation(bias, a, b)`.

It applies when the epilogue group is exactly `+ bias` (1-D, length N) followed by ReLU, with the
bf16 policy's widening cast before and a narrowing cast after; or when the GEMM is an addmm whose
bias the plan kept and the group is the ReLU alone. (GELU is left out: cuBLASLt's is the tanh
form, while torch's CPU `_addmm_activation(use_gelu=True)` applies the exact one.)

Not a generated kernel: the chain rewritten onto one library call, built, verified and timed like
every other candidate, so it ships only when measured faster than the library GEMM + epilogue
kernel and than the fused Triton GEMM. Under bf16 the GEMM reads bf16
operands (an absorbed float32 operand is cast in `launch`) and the bias is rounded to bf16, as
autocast does for a Linear layer; ReLU is applied to the float32 accumulator + bias,
then rounded once.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.templating import triton_template
from kernelwright.plan.rewrites import plain_cast
from kernelwright.space.config import Config

NAME = "torch.addmm_activation"
_DTYPES = {"float32", "bfloat16"}


@dataclass(frozen=True)
class Chain:
    bias: str  # graph value of the 1-D bias
    out_dtype: str  # dtype of the group's output
    ops: tuple[str, ...]  # the matched ops, for the module's docstring


def _is_bias(graph: Graph, v, N: int) -> bool:
    m = graph.meta(v.name) if isinstance(v, Ref) else None
    return m is not None and tuple(m.shape) == (N,) and m.dtype in _DTYPES


def match(graph: Graph, gemm: OpNode, group_nodes: list[str], group_outputs: list[str], N: int) -> Chain | str:
    """The chain this candidate computes, or why it does not apply."""
    if gemm.meta is None or gemm.meta.dtype not in _DTYPES:
        return "float32 or bf16 GEMMs only"
    bias = None
    if gemm.target == "aten.addmm.default":
        if float(gemm.kwargs.get("beta", 1)) != 1.0 or float(gemm.kwargs.get("alpha", 1)) != 1.0 \
                or not _is_bias(graph, gemm.args[0], N):
            return "addmm with scaling or a bias that is not 1-D"
        bias = gemm.args[0].name
    elif gemm.target != "aten.mm.default":
        return "not an mm/addmm"
    nodes = [graph.node(n) for n in group_nodes]
    prev, ops, i = gemm.name, [], 0

    def takes(n: OpNode) -> bool:
        return bool(n.args) and isinstance(n.args[0], Ref) and n.args[0].name == prev

    if i < len(nodes) and plain_cast(graph, nodes[i]) and takes(nodes[i]) and nodes[i].meta.dtype == "float32":
        prev, i = nodes[i].name, i + 1  # the bf16 policy's widening of the GEMM result
        ops.append("widen")
    if bias is None and i < len(nodes) and nodes[i].target == "aten.add.Tensor" and not nodes[i].kwargs \
            and len(nodes[i].args) == 2:
        a0, a1 = nodes[i].args
        other = a1 if isinstance(a0, Ref) and a0.name == prev else a0 if isinstance(a1, Ref) and a1.name == prev else None
        if other is not None and _is_bias(graph, other, N):
            bias, prev, i = other.name, nodes[i].name, i + 1
            ops.append("add bias")
    if bias is None:
        return "the epilogue does not start with a 1-D bias add"
    if i == len(nodes) or nodes[i].target != "aten.relu.default" or len(nodes[i].args) != 1 \
            or nodes[i].kwargs or not takes(nodes[i]):
        return "the bias add is not followed by ReLU"
    prev, i = nodes[i].name, i + 1
    ops.append("relu")
    if i < len(nodes) and plain_cast(graph, nodes[i]) and takes(nodes[i]):
        prev, i = nodes[i].name, i + 1
        ops.append(f"cast {graph.meta(prev).dtype}")
    if i != len(nodes) or group_outputs != [prev]:
        return "the epilogue has more than bias + ReLU"
    out = graph.meta(prev)
    if out.dtype not in _DTYPES or tuple(out.stride) != (N, 1):
        return "the epilogue's output is not a contiguous float32 / bf16 matrix"
    return Chain(bias, out.dtype, tuple(ops))


def config() -> Config:
    return Config.make(NAME, epilogue="lt")


def render(graph: Graph, gemm: OpNode, chain: Chain, a: str, b: str, name: str) -> tuple[str, list[str]]:
    """Module text whose `launch(a, b, bias)` runs the chain as one cuBLASLt call; and its inputs
    (`a`, `b`: the graph values the GEMM reads, float32 sources of absorbed bf16 casts included)."""
    dtype = gemm.meta.dtype
    ins = list(dict.fromkeys([a, b, chain.bias]))
    arg = {v: f"a{k}" for k, v in enumerate(ins)}
    text = triton_template("addmm_activation.py.j2").render(
        name=name, gemm=gemm.name, ops=" -> ".join(chain.ops), args=[arg[v] for v in ins], inputs=ins,
        a=arg[a], b=arg[b], bias=arg[chain.bias], dtype=dtype,
        cast_a=graph.meta(a).dtype != dtype, cast_b=graph.meta(b).dtype != dtype,
        cast_bias=graph.meta(chain.bias).dtype != dtype,
        out_dtype=chain.out_dtype, cast_out=chain.out_dtype != dtype, M=graph.meta(a).shape[0],
        K=graph.meta(a).shape[1], N=graph.meta(b).shape[1])
    return text, ins
