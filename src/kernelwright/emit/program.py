"""Render the forward of a captured graph as straight-line Python over ATen calls and kernels.

The same text serves the emitted `model_new.py` and in-process candidates, so what is verified
and timed is exactly what the user gets.
"""
from __future__ import annotations

import math

import torch

from kernelwright.capture.execute import CONTIGUOUS_INPUT, layout_suffix
from kernelwright.capture.graph import Graph, Ref
from kernelwright.analyze.classify import is_view
from kernelwright.plan.fusion import Plan
from kernelwright.plan.weights import weight_roots


def render_value(v) -> str:
    """A captured argument as Python source (Refs become variable names)."""
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        if math.isnan(v):
            return "float('nan')"
        return repr(v)
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return "_dev"
    if isinstance(v, torch.layout):
        return str(v)
    if isinstance(v, torch.memory_format):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(render_value(x) for x in v) + "]"
    if isinstance(v, tuple):
        inner = ", ".join(render_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    raise ValueError(f"cannot render argument {v!r} of type {type(v).__name__}")


def attr_path(fqn: str) -> str:
    """'layers.0.weight' -> 'self.layers[0].weight' style access that works for any module tree."""
    out = "self"
    for part in fqn.split("."):
        out = f"{out}.{part}" if part.isidentifier() else f"getattr({out}, {part!r})"
    return out


SDPA = "aten.scaled_dot_product_attention.default"


def weight_masked_sdpa(graph: Graph, n) -> bool:
    """Whether `n` is an SDPA call whose boolean attn_mask is computed from weights alone (a
    registered causal mask): the emitted call then asks `_kw_causal_or_mask` (model_new.py.j2),
    which checks the mask once per version and passes is_causal=True for the lower-triangular one."""
    return (n.target == SDPA and len(n.args) == 6 and isinstance(n.args[3], Ref) and n.args[5] is False
            and not n.kwargs.get("is_causal") and graph.meta(n.args[3].name) is not None
            and graph.meta(n.args[3].name).dtype == "bool" and n.args[3].name in weight_roots(graph))


def node_line(graph: Graph, name: str) -> str:
    n = graph.node(name)
    if n.target == "getitem":
        return f"{name} = {n.args[0].name}[{n.args[1]}]"
    args = [render_value(a) for a in n.args]
    if weight_masked_sdpa(graph, n):  # (mask, dropout_p, is_causal) from the once-per-version check
        args = args[:3] + [f"*_kw_causal_or_mask({args[3]}, {args[0]}, {args[1]}, {args[4]})"]
    if n.target in CONTIGUOUS_INPUT and isinstance(n.args[0], Ref):
        args[0] += ".contiguous()"  # the CUDA kernel refuses channels-last inputs
    args += [f"{k}={render_value(v)}" for k, v in n.kwargs.items()]
    fix = layout_suffix(n.target, len(n.meta.shape)) if n.meta is not None else ""
    return f"{name} = torch.ops.{n.target}({', '.join(args)}){fix}"


def _weights_only(graph: Graph, unit, roots: dict, outs: list[str]) -> list[str]:
    """The parameters a unit's outputs are computed from when they depend on nothing else (and
    the unit launches work: not a bare view, not a value the model returns); else []."""
    if unit.group is None:
        node = graph.node(unit.node)
        if is_view(node) or node.target == "getitem":
            return []
        nodes = [node]
    else:
        nodes = [graph.node(n) for n in unit.group.nodes]
    if any(o in graph.outputs or o not in roots for o in outs) or not all(n.name in roots for n in nodes):
        return []
    return sorted({r for o in outs for r in roots[o]})


def forward_lines(plan: Plan, kernels: dict[str, tuple], single_output: bool) -> list[str]:
    """Body of `forward`. `kernels` maps a group id (or node name) to (module variable, input names,
    output names, whether launch() returns the node's whole tuple) for units that run a generated
    kernel; other units run their ATen ops."""
    g = plan.graph
    lines = []
    for inp in g.inputs:
        if inp.kind in ("param", "buffer"):
            lines.append(f"{inp.name} = {attr_path(inp.fqn)}")
        elif inp.kind == "constant":
            lines.append(f"{inp.name} = self._kw_constants[{inp.fqn!r}]")
    user = g.user_inputs
    if user:
        lines.append(f"_dev = {user[0].name}.device")
    head = len(lines)
    roots = weight_roots(g)
    cache_used = False
    for unit in plan.units:
        key = unit.group.id if unit.group is not None else unit.node
        if key in kernels and kernels[key] is None:
            continue  # computed inside another unit's fused kernel
        if key in kernels:
            mod, ins, outs, whole_tuple = kernels[key]
            targets = outs[0] if whole_tuple else ", ".join(outs) + ("," if len(outs) == 1 else "")
            body = [f"{targets} = {mod}.launch({', '.join(ins)})"]
        elif unit.group is not None:
            body = [node_line(g, n) for n in unit.group.nodes]
            outs = list(unit.group.outputs)
        else:
            body = [node_line(g, unit.node)]
            outs = [unit.node]
        params = _weights_only(g, unit, roots, outs)
        if params:  # a weight transformed: once per parameter version, not once per call
            cache_used = True
            got = ", ".join(outs) + ("," if len(outs) == 1 else "")
            lines += [f"_stamp = _kw_stamp({', '.join(params)})",
                      f"_hit = _kw_cache.get({key!r})",
                      "if _hit is not None and _hit[0] == _stamp:",
                      f"    {got} = _hit[1]",
                      "else:"]
            lines += ["    " + ln for ln in body]
            lines.append(f"    _kw_cache[{key!r}] = (_stamp, ({got}))")
        else:
            lines += body
    if cache_used:
        lines.insert(head, "_kw_cache = self.__dict__.setdefault('_kw_cache', {})  # weight-only values, by version")
    # buffer updates (e.g. BatchNorm running stats): one launch per dtype, not one each
    # (_foreach_copy_ falls back to a copy per tensor when its tensors' dtypes differ)
    by_dtype: dict[str, list[tuple[str, str]]] = {}
    for name, fqn in g.mutations.items():
        meta = g.meta(name)
        by_dtype.setdefault(meta.dtype if meta is not None else "", []).append((name, fqn))
    for pairs in by_dtype.values():
        if len(pairs) == 1:
            lines.append(f"{attr_path(pairs[0][1])}.copy_({pairs[0][0]})")
            continue
        dst = ", ".join(attr_path(fqn) for _, fqn in pairs)
        lines.append(f"torch._foreach_copy_([{dst}], [{', '.join(name for name, _ in pairs)}])")
    if single_output and len(g.outputs) == 1:
        lines.append(f"return {g.outputs[0]}")
    else:
        lines.append("return (" + ", ".join(g.outputs) + ("," if len(g.outputs) == 1 else "") + ")")
    return lines
