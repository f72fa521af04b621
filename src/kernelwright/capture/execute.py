"""Run a captured graph (or part of it) with real tensors, op by op, through torch.ops.aten.

This is the "library" implementation of every node: the reference the fused kernels replace,
and the fallback for ops without a generated kernel.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

from kernelwright.capture.export import tensor_attribute
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.capture.shapes import dense_permuted


def resolve(target: str):
    """"aten.addmm.default" -> torch.ops.aten.addmm.default; "getitem" -> operator.getitem."""
    if target == "getitem":
        return operator.getitem
    ns, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def substitute(value: Any, env: dict, device: torch.device | None):
    """Replace Refs by their values and recorded devices by `device`."""
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, torch.device) and device is not None:
        return device
    if isinstance(value, (list, tuple)):
        return type(value)(substitute(v, env, device) for v in value)
    if isinstance(value, dict):
        return {k: substitute(v, env, device) for k, v in value.items()}
    return value


# ops whose CUDA kernels require an NCHW-contiguous first argument (PyTorch's group norm checks
# X.is_contiguous() on CUDA but accepts channels-last on the CPU): the library call gets a
# contiguous copy of a channels-last input (a generated kernel reads it in place)
CONTIGUOUS_INPUT = frozenset({"aten.native_group_norm.default"})


# ops whose result layout depends on the kernel PyTorch picks (scaled_dot_product_attention's fused
# kernels return [b, h, s, d] stored as [b, s, h, d], its math fallback a contiguous tensor):
# planning assumes the first (plan.attention.heads_inner_strides), so every call is followed by
# this (free when it already holds)
FIXED_LAYOUT = frozenset({"aten.scaled_dot_product_attention.default"})


def layout_suffix(target: str, rank: int) -> str:
    """Python text appended to a call of `target` (rank of its result) by the emitted forward."""
    if target not in FIXED_LAYOUT:
        return ""
    return ".transpose(1, 2).contiguous().transpose(1, 2)" if rank == 4 else ".contiguous()"


def fixed_layout(target: str, out):
    """`out` in the layout planning assumed for `target` (what layout_suffix's text does)."""
    if target not in FIXED_LAYOUT or not isinstance(out, torch.Tensor):
        return out
    return out.transpose(1, 2).contiguous().transpose(1, 2) if out.dim() == 4 else out.contiguous()


# ops whose result takes the layout of the node's metadata: a concatenation plan.pieces made in
# place of an elementwise value keeps that value's layout (the views after it assume it), where
# torch.cat returns its own (free when the two agree, as for every captured cat)
RECORDED_LAYOUT = frozenset({"aten.cat.default"})


def run_node(node: OpNode, env: dict, device: torch.device | None = None):
    fn = resolve(node.target)
    args = substitute(node.args, env, device)
    if node.target in CONTIGUOUS_INPUT and isinstance(args[0], torch.Tensor):
        args = (args[0].contiguous(), *args[1:])
    out = fixed_layout(node.target, fn(*args, **substitute(node.kwargs, env, device)))
    return in_planned_layout(out, node.meta) if node.target in RECORDED_LAYOUT else out


def bind_inputs(graph: Graph, model: torch.nn.Module, inputs: list) -> dict:
    """The environment at graph entry: user inputs, parameters, buffers and constants by name."""
    env: dict[str, Any] = {}
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(dict(model.named_buffers(remove_duplicate=False)))
    for inp in graph.inputs:
        if inp.kind == "user":
            env[inp.name] = inputs[inp.index]
        elif inp.kind in ("param", "buffer"):
            env[inp.name] = state[inp.fqn]
        elif inp.kind == "attribute" and (attr := tensor_attribute(model, inp.fqn)) is not None:
            env[inp.name] = attr  # (the live module's own, as its forward reads it)
        else:  # a tensor the forward made from Python data: beside the user inputs
            const = graph.exported.constants[inp.fqn]
            dev = next((x.device for x in inputs if isinstance(x, torch.Tensor)), const.device)
            env[inp.name] = const.to(dev)
    return env


def input_device(env: dict) -> torch.device | None:
    for v in env.values():
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def in_planned_layout(value, meta):
    """`value` laid out as `meta` says, where it is a tensor whose layout differs only by a
    permutation of a dense block (a copy in `meta`'s strides); else `value` itself."""
    if not isinstance(value, torch.Tensor) or meta is None or tuple(value.shape) != tuple(meta.shape):
        return value
    same = all(sh == 1 or a == b for sh, a, b in zip(meta.shape, value.stride(), meta.stride))
    if same or not dense_permuted(meta.shape, meta.stride) or not dense_permuted(value.shape, value.stride()):
        return value
    out = torch.empty_strided(tuple(meta.shape), tuple(meta.stride), dtype=value.dtype, device=value.device)
    return out.copy_(value)


def run_graph(graph: Graph, model: torch.nn.Module, inputs: list, keep: bool | set[str] = False,
              planned_layouts: bool = False, natural: dict | None = None):
    """Run the whole graph; returns the user outputs (a list), or, with `keep`, the environment:
    every value (keep=True), or the graph's inputs and the values named in `keep` (a set; the
    other values are let go after their last use, so the run holds about what eager holds).
    planned_layouts: each value in the layout its node's metadata gives it (a library op may
    return another: aten.native_layer_norm a contiguous result of a channels-last input the plan
    keeps channels-last), so that a unit is timed and checked on inputs laid out as the emitted
    forward lays them out where a generated kernel computes them; `natural` (a dict) then gets the
    library's result of each value so moved, for the units the library computes after all."""
    env = bind_inputs(graph, model, inputs)
    device = input_device(env)
    names = keep if isinstance(keep, (set, frozenset)) else None
    dead: dict[int, list[str]] = {}
    if names is not None:
        last = {node.name: i for i, node in enumerate(graph.nodes)}  # a value no node reads: gone at once
        for i, node in enumerate(graph.nodes):
            for v in node.inputs:
                last[v] = i
        for v, i in last.items():
            if v not in names and not graph.is_input(v) and v not in graph.outputs:
                dead.setdefault(i, []).append(v)
    for i, node in enumerate(graph.nodes):
        env[node.name] = run_node(node, env, device)
        if planned_layouts:
            value = env[node.name]
            env[node.name] = in_planned_layout(value, node.meta)
            if natural is not None and env[node.name] is not value:
                natural[node.name] = value
        for v in dead.get(i, ()):
            env.pop(v, None)
            if natural is not None:
                natural.pop(v, None)
    if keep:
        return env
    return [env[name] for name in graph.outputs]


def calibrate_strides(graph: Graph, model: torch.nn.Module, inputs: list) -> list[str]:
    """Run the graph once, op by op, and give each node's output metadata the strides the library
    call returned where they differ from the captured ones (fake tensors' strides can differ from
    a device's: a batch norm of a permuted input, contiguous on the GPU, keeps the permutation in
    its metadata; an upsample of a channels-last tensor). Plans, kernels and the memory order of
    random draws then follow the tensors the emitted forward really meets. Returns the names of
    the nodes changed. Each value is let go after its last use."""
    env = bind_inputs(graph, model, inputs)
    device = input_device(env)
    last = {node.name: i for i, node in enumerate(graph.nodes)}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    dead: dict[int, list[str]] = {}
    for v, i in last.items():
        if not graph.is_input(v):
            dead.setdefault(i, []).append(v)
    changed = []
    for i, node in enumerate(graph.nodes):
        value = env[node.name] = run_node(node, env, device)
        values = value if isinstance(value, (tuple, list)) else (value,)
        outs = list(node.outs)
        for k, (meta, v) in enumerate(zip(outs, values)):
            if (meta is None or not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(meta.shape)
                    or all(sh == 1 or a == b for sh, a, b in zip(meta.shape, v.stride(), meta.stride))):
                continue
            outs[k] = type(meta)(meta.shape, tuple(v.stride()), meta.dtype)
        if outs != list(node.outs):
            node.outs = outs
            changed.append(node.name)
        for v in dead.get(i, ()):
            env.pop(v, None)
    return changed
