"""CUDA C++ candidates for fusion groups that are one row operation over the last dim.

Softmax / log-softmax, layer norm over the last dim, and sum / mean / max / min over the last
dim of a contiguous float32 tensor map onto the CUDA templates (templates/cuda/*.cu, see
codegen/cuda_kernels.py). The rendered module (templates/cuda/unit.py.j2) embeds the CUDA source
and launches it through kw_cuda_runtime.py; its knobs are compile-time macros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelwright.capture.graph import Graph, Ref
from kernelwright.codegen.cuda_kernels import (render_layernorm, render_row_reduce, render_row_softmax,
                                               render_runtime_loader, render_standalone_launcher)
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import cuda_template
from kernelwright.plan.fusion import Group
from kernelwright.space.axes import Axis, Space
from kernelwright.space.config import Config

REDUCE = {"aten.sum.dim_IntList": "sum", "aten.mean.dim": "mean", "aten.amax.default": "max",
          "aten.amin.default": "min"}


@dataclass(frozen=True)
class RowOp:
    """A group that is a single row operation: kind, the op, and its [M, N] view."""

    kind: str  # "row_softmax" | "layernorm" | "row_reduce"
    node: str
    x: str
    M: int
    N: int
    op: str = ""  # softmax | log_softmax | sum | mean | max | min
    weight: str | None = None
    bias: str | None = None
    eps: float = 1e-5


def match(graph: Graph, group: Group) -> RowOp | None:
    """The row operation `group` is, or None when it is anything else."""
    first = graph.node(group.nodes[0])
    x = first.args[0] if first.args else None
    if not isinstance(x, Ref):
        return None
    xm = graph.meta(x.name)
    if xm is None or xm.dtype != "float32" or not xm.contiguous or len(xm.shape) == 0 or len(group.outputs) != 1:
        return None
    last = len(xm.shape) - 1
    N = xm.shape[-1]
    M = xm.numel // max(N, 1)
    t = first.target
    if t in ("aten._softmax.default", "aten._log_softmax.default") and group.nodes == [first.name]:
        if first.args[1] % len(xm.shape) != last or first.args[2]:
            return None
        return RowOp("row_softmax", first.name, x.name, M, N, "log_softmax" if "log" in t else "softmax")
    if t == "aten.native_layer_norm.default" and len(group.nodes) == 2 and len(first.args[1]) == 1:
        item = graph.node(group.nodes[1])
        if item.target != "getitem" or item.args[1] != 0 or group.outputs != [item.name]:
            return None
        w, b = first.args[2], first.args[3]
        for p in (w, b):
            if p is not None and (not isinstance(p, Ref) or not graph.meta(p.name).contiguous):
                return None
        return RowOp("layernorm", first.name, x.name, M, N, "layernorm", w.name if w is not None else None,
                     b.name if b is not None else None, float(first.args[4]))
    if t in REDUCE and group.nodes == [first.name] and not first.kwargs.get("dtype"):
        dims = first.args[1] if len(first.args) > 1 else None
        if not dims or [d % len(xm.shape) for d in dims] != [last]:
            return None
        return RowOp("row_reduce", first.name, x.name, M, N, REDUCE[t])
    return None


def space(row: RowOp) -> list[Config]:
    """Block size, 16-byte vectors, row in registers, warp-per-row, one-pass statistics."""
    template = f"cuda.{row.kind}"

    def fits(c) -> bool:
        if c["vec"] == 4 and row.N % 4:
            return False
        group = 32 if c["warp_row"] else c["threads"]
        per = group * c["vec"]
        if c["in_registers"] and math.ceil(row.N / per) > 16:
            return False
        if c["warp_row"] and (row.N > 4096 or c["threads"] != 128):
            return False
        return c["threads"] * c["vec"] <= max(128, 4 * row.N)

    axes = [Axis("threads", [128, 256, 512, 1024]), Axis("vec", [4, 1]), Axis("in_registers", [True, False]),
            Axis("warp_row", [False, True])]
    if row.kind == "row_softmax":
        axes.append(Axis("online", [True, False]))
    if row.kind == "layernorm":
        axes.append(Axis("welford", [False, True]))
    return Space(template, axes, [fits]).configs()


def default(row: RowOp) -> Config:
    """Rows that fit: 512 threads x float4 with the row in registers; longer rows: streaming
    (online softmax); short rows (<= 1024): one warp per row."""
    configs = space(row)
    prefer = [c for c in configs if c["in_registers"] and c["threads"] == 512] or \
             [c for c in configs if c["threads"] == 512] or configs
    if row.N <= 1024:
        prefer = [c for c in configs if c["warp_row"]] or prefer
    return prefer[0]


def _spec(row: RowOp, c: dict):
    group = 32 if c["warp_row"] else c["threads"]
    reg = math.ceil(row.N / (group * c["vec"])) if c["in_registers"] else 0
    knobs = dict(threads=c["threads"], vec=c["vec"], warp_row=c["warp_row"], reg_items=reg)
    if row.kind == "row_softmax":
        return render_row_softmax(log=row.op == "log_softmax", online=c.get("online", False), **knobs)
    if row.kind == "layernorm":
        return render_layernorm(row.weight is not None, row.bias is not None, welford=c.get("welford", True), **knobs)
    return render_row_reduce(row.op, **knobs)


def render(graph: Graph, group: Group, row: RowOp, config: dict) -> tuple[str, list[str]]:
    """(module text, graph values passed to launch) for one config."""
    spec = _spec(row, config)
    ins = [row.x] + [v for v in (row.weight, row.bias) if v is not None]
    args = [f"a{i}" for i in range(len(ins))]
    checks = [f"{a} = _expect({a}, {tuple(graph.meta(v).shape)!r}, {tuple(graph.meta(v).stride)!r}, {v!r})"
              for a, v in zip(args, ins)]
    out_name = group.outputs[0]
    call = f"{args[0]}.view({row.M}, {row.N})"
    if row.kind == "layernorm":
        w = args[1] if row.weight is not None else "None"
        b = args[1 + (row.weight is not None)] if row.bias is not None else "None"
        call += f", {w}, {b}, eps={row.eps!r}"
    text = cuda_template("unit.py.j2").render(
        gid=group.id, what=f"{row.op} over the last dim of [{row.M}, {row.N}]", template=f"{spec.kind}.cu"
        if spec.kind != "layernorm" else "row_reduce.cu", knobs=dict(spec.defines), loader=render_runtime_loader(),
        standalone=render_standalone_launcher(spec, "KERNEL"), args=args, input_doc=", ".join(ins), output=out_name,
        checks=checks, out_2d=(row.M,) if row.kind == "row_reduce" else (row.M, row.N), var="KERNEL", call=call,
        out_shape=tuple(graph.meta(out_name).shape))
    return with_helpers(text), ins
