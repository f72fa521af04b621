"""Concatenations written in place: the values a `torch.cat` joins are computed into the slices of
its output, which is allocated once.

`aten.cat` reads every input again and writes the whole output: on a CNN that concatenates branch
outputs (Inception, SqueezeNet's fire module) or a growing feature list (a DenseNet block: cat
after cat of the same features) that copy is as large as the outputs themselves, and a chain of
cats copies the first features once per layer. Here each cat whose output is dense gets a buffer
(the last cat of a chain: its `root`), and

* a value it joins that a kernel computes (`placed`) lives in its slice: the value's metadata takes
  the buffer's strides, so a generated kernel computing it writes the slice directly (its launch
  takes the slice as `out<i>`), and a library call's result is copied there once and the slice
  used from then on;
* a value that cannot live there (a graph input, a value read through views, a returned value) is
  copied into its slice once it exists (`copied`);
* an earlier cat whose inputs all lie in one buffer, in order and adjacent, is that buffer's
  narrowed view: it copies nothing.

The forward is not differentiated through (the emitted module runs the original forward when
gradients are needed), so writing into a buffer other values view is safe.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelwright.analyze.cost import consumers
from kernelwright.capture.graph import Graph, Ref, TensorMeta
from kernelwright.capture.shapes import dense_permuted

CAT = "aten.cat.default"

# ops whose output views their input: a value read through one cannot move into a slice (the view's
# recorded strides assume the value's own layout)
_VIEW_WORDS = ("view", "permute", "transpose", "slice", "select", "expand", "squeeze", "alias", "as_strided",
               "split", "chunk", "unbind", "narrow", "unfold", "reshape", "detach", "diagonal", "aten.t.",
               "getitem", "lift_fresh")


@dataclass(frozen=True)
class Slot:
    """Where a value lies in a concatenation buffer: `buffer` (the root cat's value) narrowed along
    `dim` at `offset`. `placed`: the value lives there (its metadata has the buffer's strides);
    else it is copied there once computed."""

    buffer: str
    dim: int
    offset: int
    placed: bool


def placed_slot(graph: Graph, value: str) -> Slot | None:
    """The slot `value` lives in (a placed value: its metadata has the buffer's strides), else None."""
    slot = graph.slots.get(value)
    return slot if slot is not None and slot.placed else None


def buffers(graph: Graph) -> dict[str, None]:
    """The concatenation buffers the slots name (root cats' values), in first-slot order."""
    return dict.fromkeys(s.buffer for s in graph.slots.values())


def cat_args(graph: Graph, node) -> tuple[list[str], int] | None:
    """(the joined values, the dim) of a cat node whose inputs are all tensors of its rank, else None."""
    if node.target != CAT or not node.args or not isinstance(node.args[0], (list, tuple)):
        return None
    xs = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    meta = node.meta
    if meta is None or not isinstance(dim, int) or not all(isinstance(x, Ref) for x in xs) or not xs:
        return None
    dim %= len(meta.shape)
    for x in xs:
        m = graph.meta(x.name)
        if m is None or len(m.shape) != len(meta.shape) or m.dtype != meta.dtype or m.numel == 0:
            return None
    return [x.name for x in xs], dim


def _aliasing(target: str) -> bool:
    return any(w in target for w in _VIEW_WORDS)


def place_concats(graph: Graph) -> list[str]:
    """Give `graph.slots` a Slot for each value joined in place (module docstring) and the placed
    values (and cats narrowed from a buffer) the buffer's strides; one line per buffer."""
    users = consumers(graph)
    outputs, mutated = set(graph.outputs), set(graph.mutations)
    slots: dict[str, Slot] = {}
    strides: dict[str, tuple[int, ...]] = {}  # buffer -> its strides
    notes: dict[str, list[str]] = {}

    def movable(v: str) -> bool:
        """Whether `v` may live in a slice (its readers see the slice's strides)."""
        if graph.is_input(v) or v in outputs or v in mutated or v in slots:
            return False
        return not _aliasing(graph.node(v).target) and not any(
            _aliasing(u.target) for u in users.get(v, ()) if u.target != CAT)

    for node in reversed(graph.nodes):
        parsed = cat_args(graph, node)
        if parsed is None:
            continue
        xs, dim = parsed
        meta = node.meta
        slot = slots.get(node.name)
        if slot is None:
            if node.name in mutated or not dense_permuted(meta.shape, meta.stride):
                continue
            root, base = node.name, 0
            strides[root] = tuple(meta.stride)
        elif slot.placed and slot.dim == dim:
            root, base = slot.buffer, slot.offset
        else:
            continue
        off = base
        for x in xs:
            width = graph.meta(x).shape[dim]
            here = Slot(root, dim, off, True)
            known = slots.get(x)
            if known is None:
                if movable(x):
                    slots[x] = here
                    notes.setdefault(root, []).append(x)
                elif not graph.is_input(x) or graph.input(x).kind in ("user", "constant"):
                    slots[x] = Slot(root, dim, off, False)
            off += width
    # an earlier cat whose inputs lie adjacent, in order, in one buffer (a DenseNet block's cats of
    # the growing feature list): the buffer narrowed, copying nothing (the first pass took it for a
    # root of its own that found its inputs taken)
    placing = {s.buffer for s in slots.values() if s.placed}
    for node in graph.nodes:
        parsed = cat_args(graph, node)
        if parsed is None or node.name in slots or node.name in placing:
            continue
        xs, dim = parsed
        first = slots.get(xs[0])
        if first is None or first.buffer == node.name or first.dim != dim or not movable(node.name):
            continue
        off, ok = first.offset, True
        for x in xs:
            s = slots.get(x)
            ok = ok and s is not None and s.buffer == first.buffer and s.dim == dim and s.offset == off
            off += graph.meta(x).shape[dim]
        if ok:
            slots[node.name] = Slot(first.buffer, dim, first.offset, True)
            notes.setdefault(first.buffer, []).append(node.name)
    # roots that place nothing keep their cat (a copy either way)
    kept = {s.buffer for s in slots.values() if s.placed}
    slots = {v: s for v, s in slots.items() if s.buffer in kept}
    for v, s in slots.items():
        if s.placed:
            n = graph.node(v)
            n.outs = [TensorMeta(n.meta.shape, strides[s.buffer], n.meta.dtype)] + list(n.outs[1:])
    graph.slots = slots
    return [f"{root}: {', '.join(vs)} computed into the concatenation's buffer" for root, vs in notes.items()
            if root in kept]
