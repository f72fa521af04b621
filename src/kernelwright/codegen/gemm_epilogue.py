"""GEMM with its pointwise epilogue group fused in: a library GEMM node (mm / addmm) whose only
consumer is a pointwise group becomes one Triton GEMM (templates/triton/gemm.py.j2) whose
epilogue is that group's expressions (same op table, same statements as the group kernel).
"""
from __future__ import annotations

from dataclasses import dataclass
from kernelwright.capture.graph import Graph, OpNode
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.codegen.templating import template_text
from kernelwright.codegen.triton_gemm import precision_kwargs, render_gemm
from kernelwright.codegen.triton_group import Lowering, Unsupported, lower
from kernelwright.plan.fusion import Group

GEMMS = {"aten.mm.default", "aten.addmm.default"}


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

    @property
    def inputs(self) -> list[str]:
        return list(dict.fromkeys([self.a, self.b] + self.operands))


def fusable(graph: Graph, gemm: OpNode, group: Group) -> str | None:
    """None when `gemm`'s output feeds only `group` and the group can be its epilogue."""
    if gemm.target not in GEMMS:
        return "not an mm/addmm"
    if group.rdims is not None:
        return "epilogue group has reductions"
    if gemm.name in graph.outputs or gemm.name in graph.mutations:
        return "the GEMM output itself is a model output"
    members = set(group.nodes)
    if any(u.name not in members for u in graph.users(gemm.name)):
        return "the GEMM output has consumers outside the group"
    if len(group.outputs) != 1 or tuple(group.domain) != tuple(gemm.meta.shape):
        return "the group must produce one value of the GEMM's shape"
    if gemm.meta.dtype != "float32":
        return "float32 only"
    return None


def build(graph: Graph, gemm: OpNode, group: Group) -> GemmEpilogue:
    """The epilogue (operands + statements) for `group` applied to `gemm`'s accumulator."""
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
    ops: list[EpilogueOperand] = []
    values: list[str] = []
    code: list[str] = []

    def operand(value: str, strides) -> str:
        if all(s == 0 for s in strides):
            kind = "scalar"
        elif strides[0] == 0:
            kind = "col"
        elif strides[1] == 0:
            kind = "row"
        else:
            kind = "full"
        name = f"e{len(ops)}"
        ops.append(EpilogueOperand(name, kind))
        values.append(value)
        return name

    acc = "acc" if alpha == 1.0 else f"acc * {alpha!r}"
    if bias is not None and beta != 0.0:
        bname = operand(bias.name, low._domain_strides(graph.meta(bias.name), "full"))
        code.append(f"acc = {acc} + {bname}" + ("" if beta == 1.0 else f" * {beta!r}"))
    elif alpha != 1.0:
        code.append(f"acc = {acc}")
    for st in low.stmts:
        if st.kind == "load":
            op = st.operand
            if op.value == gemm.name:
                if op.strides != (N, 1):
                    raise Unsupported("the group reads the GEMM output through a view")
                code.append(f"{st.var} = acc")
            else:
                code.append(f"{st.var} = {operand(op.value, op.strides)}")
        elif st.kind == "expr":
            code.append(f"{st.var} = {st.code}")
        elif st.kind == "store":
            code.append(f"acc = {st.deps[0]}")
        else:
            raise Unsupported(f"statement {st.kind} in a GEMM epilogue")
    return GemmEpilogue(gemm, group, Epilogue(tuple(ops), "\n".join(code)), a.name, b.name, values, M, N, K)


def render(fused: GemmEpilogue, config: dict, precision: str) -> tuple[str, list[str]]:
    """Module text whose `launch(*inputs)` runs the fused GEMM with `config`; and its inputs."""
    text = render_gemm(fused.epilogue, batched=False, name=f"{fused.group.id}_gemm")
    helpers = template_text("triton", "helpers.py.j2")
    ins = fused.inputs
    arg = {v: f"a{i}" for i, v in enumerate(ins)}
    kw = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
          if k in config}
    kw.update(precision_kwargs(precision))
    call = ", ".join([arg[fused.a], arg[fused.b]] + [arg[v] for v in fused.operands]
                     + [f"{k}={v!r}" for k, v in kw.items()])
    wrapper = f'''

{helpers.strip()}


_gemm_launch = launch


def launch({", ".join(arg[v] for v in ins)}):
    """{fused.gemm.op} [{fused.M}x{fused.K}] @ [{fused.K}x{fused.N}] with group {fused.group.id} fused as its epilogue.

    Inputs: {", ".join(ins)}. Returns ({fused.group.outputs[0]},)."""
    return (_gemm_launch({call}),)
'''
    return text + wrapper, ins
