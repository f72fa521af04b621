"""The captured graph: a small, FX-independent record of ATen ops in topological order.

Every later stage (analyze, plan, codegen, emit) reads this record; the FX node stays attached
for stages that need the original object.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kernelwright.capture.shapes import channels_last_strides, contiguous_strides


@dataclass(frozen=True)
class Ref:
    """A reference to another node's value inside an op's arguments."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # e.g. "float32"

    @classmethod
    def dense(cls, shape, dtype: str) -> "TensorMeta":
        """A row-major (contiguous) tensor of this shape and dtype."""
        shape = tuple(shape)
        return cls(shape, contiguous_strides(shape), dtype)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2,
                "int16": 2, "bool": 1, "int8": 1, "uint8": 1}.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def span(self) -> int:
        """The largest element offset from the first element (what a kernel's offsets reach)."""
        return sum((n - 1) * abs(st) for n, st in zip(self.shape, self.stride))

    @property
    def contiguous(self) -> bool:
        return all(sh == 1 or st == e for sh, st, e in zip(self.shape, self.stride, contiguous_strides(self.shape)))

    @property
    def channels_last(self) -> bool:
        """Whether this [N, C, *spatial] tensor (2 or 3 spatial dims) is stored channels-last(-3d)."""
        return len(self.shape) in (4, 5) and all(
            sh == 1 or st == e for sh, st, e in zip(self.shape, self.stride, channels_last_strides(self.shape)))

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "stride": list(self.stride), "dtype": self.dtype}


@dataclass
class Input:
    """A graph input: a user input, a parameter, a buffer, a tensor attribute of a module (neither
    of those, e.g. an RNN's initial state made in __init__: read from the live module, like a
    buffer) or a constant the forward makes from Python data."""

    name: str
    kind: str  # "user" | "param" | "buffer" | "attribute" | "constant"
    meta: TensorMeta | None
    fqn: str | None = None  # module path of a parameter, buffer or attribute, e.g. "conv.weight"
    index: int | None = None  # position among the user inputs
    value: Any = None  # a number given as a user input: the graph is specialised for it (meta None)


@dataclass
class OpNode:
    """One ATen call (or a `getitem` picking one output of a multi-output call)."""

    name: str
    target: str  # "aten.addmm.default", or "getitem"
    args: tuple
    kwargs: dict
    outs: list[TensorMeta | None]  # one entry per output; None for non-tensor outputs
    fx: Any = field(default=None, repr=False, compare=False)

    @property
    def op(self) -> str:
        """The overload packet name: "aten.addmm.default" -> "addmm"."""
        parts = self.target.split(".")
        return parts[1] if len(parts) >= 2 and parts[0] == "aten" else self.target

    @property
    def meta(self) -> TensorMeta | None:
        return self.outs[0] if self.outs else None

    @property
    def inputs(self) -> list[str]:
        """Names of the nodes/inputs this op reads, in argument order, without repeats."""
        seen: list[str] = []
        for r in iter_refs((self.args, self.kwargs)):
            if r.name not in seen:
                seen.append(r.name)
        return seen


def iter_refs(value: Any):
    """Every Ref inside nested tuples, lists and dicts."""
    if isinstance(value, Ref):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from iter_refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_refs(v)


def renamed(value: Any, mapping: dict[str, str]) -> Any:
    """`value` with every Ref to a name in `mapping` pointing at the mapped name instead."""
    if isinstance(value, Ref):
        return Ref(mapping.get(value.name, value.name))
    if isinstance(value, (list, tuple)):
        return type(value)(renamed(v, mapping) for v in value)
    if isinstance(value, dict):
        return {k: renamed(v, mapping) for k, v in value.items()}
    return value


def reading(node: "OpNode", mapping: dict[str, str]) -> "OpNode":
    """`node` reading the values `mapping` names in place of the ones it read (itself if none)."""
    if not mapping or not any(r.name in mapping for r in iter_refs((node.args, node.kwargs))):
        return node
    return OpNode(node.name, node.target, renamed(node.args, mapping), renamed(node.kwargs, mapping), node.outs,
                  node.fx)


def unique_name(taken: set[str], base: str) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first not in `taken` (which then holds it)."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def rebuilt(nodes: "list[OpNode]", gone: set[str], swap: dict, emit: Callable) -> "list[OpNode]":
    """`nodes` in order without those named in `gone`; each node named in `swap` is replaced by what
    `emit(node, swap[node.name], out)` appends to `out`, the list being built."""
    out: list[OpNode] = []
    for n in nodes:
        if n.name in swap:
            emit(n, swap[n.name], out)
        elif n.name not in gone:
            out.append(n)
    return out


@dataclass
class Graph:
    name: str
    inputs: list[Input]
    nodes: list[OpNode]
    outputs: list[str]  # names of user outputs, in order (may name inputs)
    mutations: dict[str, str] = field(default_factory=dict)  # node name -> buffer fqn it writes
    exported: Any = field(default=None, repr=False)
    # value -> where it lies in a concatenation's buffer (plan.concat.Slot), set last, before planning
    slots: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self._by_name = {n.name: n for n in self.nodes}
        self._inputs = {i.name: i for i in self.inputs}

    def node(self, name: str) -> OpNode:
        return self._by_name[name]

    def is_input(self, name: str) -> bool:
        return name in self._inputs

    def producer(self, value) -> OpNode | None:
        """The node computing `value` where it is a Ref to a node's result (None for an input or
        a constant)."""
        if not isinstance(value, Ref) or value.name in self._inputs:
            return None
        return self._by_name[value.name]

    def input(self, name: str) -> Input:
        return self._inputs[name]

    def meta(self, name: str) -> TensorMeta | None:
        if name in self._inputs:
            return self._inputs[name].meta
        return self._by_name[name].meta

    def users(self, name: str) -> list[OpNode]:
        return [n for n in self.nodes if name in n.inputs]

    @property
    def user_inputs(self) -> list[Input]:
        return sorted((i for i in self.inputs if i.kind == "user"), key=lambda i: i.index)
