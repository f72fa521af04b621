"""Render the forward of a captured graph as straight-line Python over ATen calls and kernels.

The same text serves the emitted `model_new.py` and in-process candidates, so what is verified
and timed is exactly what the user gets.
"""
from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch

from kernelwright.capture.execute import CONTIGUOUS_INPUT, layout_suffix
from kernelwright.capture.graph import Graph, Ref
from kernelwright.capture.shapes import dense_permuted
from kernelwright.plan.attention import SDPA
from kernelwright.plan.concat import buffers, cat_args, placed_slot
from kernelwright.plan.fusion import Plan
from kernelwright.plan.weights import weight_only, weight_roots


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


def weight_masked_sdpa(graph: Graph, n) -> bool:
    """Whether `n` is an SDPA call whose boolean attn_mask is computed from weights alone (a
    registered causal mask): the emitted call then asks the runtime's `causal_or_mask`
    (emit/runtime.py), which checks the mask once per version and passes is_causal=True for the
    lower-triangular one."""
    return (n.target == SDPA and len(n.args) == 6 and isinstance(n.args[3], Ref) and n.args[5] is False
            and not n.kwargs.get("is_causal") and graph.meta(n.args[3].name) is not None
            and graph.meta(n.args[3].name).dtype == "bool" and n.args[3].name in weight_roots(graph))


# ATen overloads the emitted forward calls through the Python API instead of torch.ops: the same
# op, reached through the generated bindings in about half the host time (torch.ops' OpOverload
# path costs ~2-4 us more per call, measured on the CPU); these sit on the host-bound path of small
# models. (method or function, name, keyword arguments the public API takes under the same names)
# A view is called as reshape: the graph is functional, and its input may come from a generated
# kernel or a rewrite in another layout than the traced one, where view would raise (a reshape of
# a transposed attention output); reshape is that view wherever the view exists.
FAST_CALLS = {
    "aten.view.default": ("method", "reshape", ()),
    "aten.reshape.default": ("method", "reshape", ()),
    "aten.permute.default": ("method", "permute", ()),
    "aten.transpose.int": ("method", "transpose", ()),
    "aten.unsqueeze.default": ("method", "unsqueeze", ()),
    "aten.squeeze.dim": ("method", "squeeze", ()),
    "aten.expand.default": ("method", "expand", ()),
    "aten.clone.default": ("method", "clone", ("memory_format",)),
    "aten.split_with_sizes.default": ("method", "split_with_sizes", ()),
    "aten.mm.default": ("function", "mm", ()),
    "aten.bmm.default": ("function", "bmm", ()),
    "aten.addmm.default": ("function", "addmm", ("beta", "alpha")),
    "aten.convolution.default": ("function", "convolution", ()),
}


def _call(n, args: list[str]) -> str:
    """`args` (rendered, keywords last) applied to node `n`'s op."""
    fast = FAST_CALLS.get(n.target)
    if fast is not None and isinstance(n.args[0], Ref) and set(n.kwargs) <= set(fast[2]):
        kind, fn, _ = fast
        if kind == "method":
            return f"{args[0]}.{fn}({', '.join(args[1:])})"
        return f"torch.{fn}({', '.join(args)})"
    return f"torch.ops.{n.target}({', '.join(args)})"


def node_line(graph: Graph, name: str) -> str:
    n = graph.node(name)
    if n.target == "getitem":
        return f"{name} = {n.args[0].name}[{n.args[1]}]"
    args = [render_value(a) for a in n.args]
    if weight_masked_sdpa(graph, n):  # (mask, dropout_p, is_causal) from the once-per-version check
        args = args[:3] + [f"*_rt.causal_or_mask({args[3]}, {args[0]}, {args[1]}, {args[4]})"]
    if n.target in CONTIGUOUS_INPUT and isinstance(n.args[0], Ref):
        args[0] += ".contiguous()"  # the CUDA kernel refuses channels-last inputs
    args += [f"{k}={render_value(v)}" for k, v in n.kwargs.items()]
    fix = layout_suffix(n.target, len(n.meta.shape)) if n.meta is not None else ""
    return f"{name} = {_call(n, args)}{fix}"


def constant_line(graph: Graph, inp, device: str) -> str:
    """A tensor the original forward made from Python data (a lifted constant), as a literal made
    once per device by the runtime's `constant` (emit/runtime.py)."""
    value = graph.exported.constants[inp.fqn]
    return (f"{inp.name} = _rt.constant({inp.name!r}, {render_value(value.tolist())}, {value.dtype}, "
            f"{device})")


def counter_increments(graph: Graph) -> dict[str, tuple[str, object]]:
    """Buffer updates that are `buffer + constant` read by nothing else (batch norm's
    num_batches_tracked += 1): node name -> (buffer fqn, constant). The forward adds them in place
    with one `_foreach_add_` instead of computing each sum and copying it back."""
    out = {}
    for name, fqn in graph.mutations.items():
        if graph.is_input(name) or name in graph.outputs or graph.users(name):
            continue
        n = graph.node(name)
        src = n.args[0] if n.args else None
        if n.target == "aten.add.Tensor" and len(n.args) == 2 and not n.kwargs and isinstance(src, Ref) \
                and graph.is_input(src.name) and graph.input(src.name).fqn == fqn \
                and isinstance(n.args[1], (int, float)) and not isinstance(n.args[1], bool):
            out[name] = (fqn, n.args[1])
    return out


def _in_recorded_layout(graph: Graph, name: str) -> str:
    """A returned value's expression: itself, or through `_rt.eager_layout` with its recorded
    strides where they are a dense layout (pipeline.keep_output_layouts records eager's) and the
    value is computed (an input or a broadcast view is returned as it comes)."""
    meta = graph.meta(name)
    if graph.is_input(name) or meta is None or not dense_permuted(meta.shape, meta.stride) or len(meta.shape) < 2:
        return name
    return f"_rt.eager_layout({name}, {tuple(meta.stride)!r})"


def _unit_inputs(graph: Graph, unit, kernel) -> list[str]:
    """Values a unit reads (a generated kernel: its launch inputs)."""
    if kernel is not None:
        return list(kernel[1])
    names = unit.nodes
    inside = set(names)
    return [v for n in names for v in graph.node(n).inputs if v not in inside]


def table_path(fqn: str, kind: str) -> str:
    """'layer1.0.bn.running_mean' (a buffer) -> "self._modules['layer1']._modules['0']._modules['bn']._buffers['running_mean']":
    the tables nn.Module attribute access reads, looked up directly (nn.Module.__getattr__ costs
    about 3 us of host time a hop; resnet_basic_block's 12 tensors took 34 us, the tables 1 us)."""
    *mods, leaf = fqn.split(".")
    return "self" + "".join(f"._modules[{m!r}]" for m in mods) + \
        f".{'_parameters' if kind == 'param' else '_buffers'}[{leaf!r}]"


STATE = ("param", "buffer", "attribute")  # the graph inputs the forward reads from the live module


def state_reads(plan: Plan) -> list[tuple[str, str, str]]:
    """The parameters, buffers and tensor attributes the forward reads: (local name, lookup in the
    module tables, attribute access on `self`). The forward reads them through its `_kw_tensors`
    function (model_new.py.j2: the tables, or attributes when a table lacks one, e.g. a
    parametrized weight); their addresses and versions also identify a CUDA graph capture of the
    forward."""
    return [(i.name, attr_path(i.fqn) if i.kind == "attribute" else table_path(i.fqn, i.kind), attr_path(i.fqn))
            for i in plan.graph.inputs if i.kind in STATE]


def attribute_shapes(plan: Plan) -> list[tuple[int, tuple, tuple]]:
    """(position among state_reads, shape, strides) of each tensor attribute the forward reads: an
    attribute (unlike a parameter) may be replaced by one of another size, which the kernels were
    not specialised for (the runtime then runs the original forward)."""
    state = [i for i in plan.graph.inputs if i.kind in STATE]
    return [(k, tuple(i.meta.shape), tuple(i.meta.stride)) for k, i in enumerate(state) if i.kind == "attribute"]


class ForwardText(NamedTuple):
    """The emitted forward. `body` computes the result (`result`, the expression it returns) and the
    new values of the buffers the forward updates (`new`, variable names); `commit` writes them
    (and the counters' increments) into the buffers in place, given `new` as its arguments, []
    when the forward updates no buffer. Kept apart so that a CUDA graph of the body can be
    replayed before its state is checked and the update made only once it holds."""
    body: list[str]
    result: str
    new: list[str]
    commit: list[str]


def _narrow(slot, width: int) -> str:
    return f"{slot.buffer}.narrow({slot.dim}, {slot.offset}, {width})"


def _slot_lines(g: Graph, outs: list[str], passed: set[str]) -> list[str]:
    """After a unit: each of its values that lies in a concatenation's buffer put there (a placed
    value not written there by its kernel: copied, then read from the slice; a copied one: copied)."""
    lines = []
    for v in outs:
        slot = g.slots.get(v)
        if slot is None or v in passed:
            continue
        if slot.placed:
            lines.append(f"{v} = _cp.into({slot.buffer}, {slot.dim}, {slot.offset}, {v})")
        else:
            lines.append(f"_cp.copy_into({_narrow(slot, g.meta(v).shape[slot.dim])}, {v})")
    return lines


def _cat_lines(g: Graph, name: str, cat_buffers: dict[str, None]) -> list[str] | None:
    """A concatenation computed in place (plan.concat): a root (one of `cat_buffers`) copies the values not
    already in its buffer; a cat lying in another's buffer is its view, copying those it joins that
    lie elsewhere. None: an ordinary cat."""
    node = g.node(name)
    parsed = cat_args(g, node)
    slot = placed_slot(g, name)
    if parsed is None or (slot is None and name not in cat_buffers):
        return None
    xs, dim = parsed
    if slot is not None:
        buffer, base, lines = slot.buffer, slot.offset, [f"{name} = {_narrow(slot, node.meta.shape[slot.dim])}"]
    else:
        buffer, base, lines = name, 0, []
    off = 0
    for x in xs:  # (the values not already in their slice: copied now)
        width = g.meta(x).shape[dim]
        s = g.slots.get(x)
        if s is None or (s.buffer, s.dim, s.offset) != (buffer, dim, base + off):
            lines.append(f"_cp.copy_into({name}.narrow({dim}, {off}, {width}), {x})")
        off += width
    return lines


def forward_text(plan: Plan, kernels: dict[str, tuple], single_output: bool, mode: str = "any",
                 tensors: str | None = None, out_params: dict[str, set[int]] | None = None) -> ForwardText:
    """The forward's text (ForwardText). `kernels` maps a group id (or node name) to (module
    variable, input names, output names, whether launch() returns the node's whole tuple) for units
    that run a generated kernel; other units run their ATen ops.

    Units computed from parameters alone (a weight transposed, cast to bf16, copied channels-last;
    plan.weights) run first, every call: a cache keyed by the parameters' identity and version
    would go stale when a parameter is changed through `.data` (which moves no version), and
    the work is what eager's autocast does each call too. A CUDA-graph replay recomputes them
    from the parameters' memory as well. `tensors` names the function that reads the parameters
    and buffers (default `_kw_tensors_<mode>`: a module emits one forward per training mode whose
    graph differs)."""
    g = plan.graph
    lines = []
    reader = tensors or f"_kw_tensors_{mode}"
    names = [i.name for i in g.inputs if i.kind in STATE]
    unpack = [f"{', '.join(names)}{',' if len(names) == 1 else ''} = {reader}(self)"] if names else []
    lines += unpack
    local = {i.fqn: i.name for i in g.inputs if i.kind in ("param", "buffer")}
    user = [i for i in g.user_inputs if i.meta is not None]  # (tensors: a number has no device)
    if user:
        lines.append(f"_dev = {user[0].name}.device")
    for inp in g.inputs:
        if inp.kind == "constant":
            lines.append(constant_line(g, inp, "_dev" if user else "None"))
    roots = weight_roots(g)
    out_params = out_params or {}
    cat_buffers = buffers(g) if user else {}
    slots = g.slots if user else {}
    for b in cat_buffers:
        m = g.meta(b)
        lines.append(f"{b} = torch.empty_strided({tuple(m.shape)!r}, {tuple(m.stride)!r}, dtype=torch.{m.dtype}, "
                     "device=_dev)")
    lines += [f"_cp.copy_into({_narrow(s, g.meta(v).shape[s.dim])}, {v})" for v, s in slots.items() if g.is_input(v)]
    counters = counter_increments(g)
    skipped = {n for u in plan.units if u.name not in kernels and all(n in counters for n in u.nodes)
               for n in u.nodes}
    prologue, main, hoisted = [], [], set()
    generated: set[str] = set()  # values a generated kernel computes
    for unit in plan.units:
        key = unit.name
        if key in kernels and kernels[key] is None:
            continue  # computed inside another unit's fused kernel
        if all(n in skipped for n in unit.nodes):
            continue  # counters: added in place with the buffer updates below
        kernel = kernels.get(key)
        passed: set[str] = set()
        if kernel is not None:
            mod, ins, outs, whole_tuple = kernel
            generated.update(outs)
            targets = outs[0] if whole_tuple else ", ".join(outs) + ("," if len(outs) == 1 else "")
            into = [f"out{i}={_narrow(slots[v], g.meta(v).shape[slots[v].dim])}" for i, v in enumerate(outs)
                    if not whole_tuple and slots and placed_slot(g, v) is not None and i in out_params.get(key, ())]
            passed = {v for i, v in enumerate(outs) if any(a.startswith(f"out{i}=") for a in into)}
            body = [f"{targets} = {mod}.launch({', '.join(list(ins) + into)})"]
        else:
            cat = _cat_lines(g, unit.nodes[0], cat_buffers) if slots and len(unit.nodes) == 1 else None
            body = cat if cat is not None else [node_line(g, n) for n in unit.nodes]
            outs = unit.outputs
            if cat is not None:
                generated.update(outs)  # (a buffer allocated in the cat's recorded layout)
                passed = set(outs)
        body += _slot_lines(g, outs, passed) if slots else []
        # computed from the weights alone (from values hoisted before it): first, ahead of the inputs
        if weight_only(g, outs, roots) and all(g.is_input(v) or v in hoisted
                                               for v in _unit_inputs(g, unit, kernel)):
            prologue += body
            hoisted.update(outs)
        else:
            main += body
    lines += prologue
    lines += main
    if user and not any(re.search(r"\b_dev\b", line) for line in lines[len(unpack) + 1:]):
        del lines[len(unpack)]  # the device is read by no line
    # buffer updates (e.g. BatchNorm running stats): one launch per dtype, not one each
    # (_foreach_copy_ falls back to a copy per tensor when its tensors' dtypes differ)
    commit: list[str] = []
    by_step: dict[object, list[str]] = {}  # counters: buffer += step, in place, one launch per step
    for name in g.mutations:
        if name in skipped:
            by_step.setdefault(counters[name][1], []).append(counters[name][0])
    for step, fqns in by_step.items():
        dst = ", ".join(local.get(f) or attr_path(f) for f in sorted(fqns))
        commit.append(f"torch._foreach_add_([{dst}], {step!r})")
    by_dtype: dict[str, list[tuple[str, str]]] = {}
    for name, fqn in g.mutations.items():
        if name in skipped:
            continue
        meta = g.meta(name)
        by_dtype.setdefault(meta.dtype if meta is not None else "", []).append((name, fqn))
    new: list[str] = []
    for pairs in by_dtype.values():
        new += [name for name, _ in pairs]
        if len(pairs) == 1:
            commit.append(f"{local.get(pairs[0][1]) or attr_path(pairs[0][1])}.copy_({pairs[0][0]})")
            continue
        dst = ", ".join(local.get(fqn) or attr_path(fqn) for _, fqn in pairs)
        commit.append(f"torch._foreach_copy_([{dst}], [{', '.join(name for name, _ in pairs)}])")
    # (a generated kernel writes its outputs in their recorded strides already)
    outs = [o if o in generated else _in_recorded_layout(g, o) for o in g.outputs]
    if single_output and len(outs) == 1:
        result = outs[0]
    else:
        result = "(" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")"
    return ForwardText(lines, result, list(dict.fromkeys(new)), unpack + commit if commit else [])
