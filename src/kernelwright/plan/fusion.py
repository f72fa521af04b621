"""Partition a captured graph into fusion groups over a common iteration domain.

A group is a set of ops that one kernel computes: elementwise ops over a domain shape `D`,
plus reductions over one set of dims `Rd` of that domain (sum, mean, max, min, argmax, argmin,
var, vector norms) and row composites (softmax, log-softmax, layer / group / instance / training
batch norm). A value's level says how a kernel holds it: "full" (domain-shaped; also ops on a
view of the domain, e.g. group norm's [N, C, H, W] output over the domain [N, G, C/G, H*W]),
"row" (one value per kept index), "row_b" (a row value expanded over the domain) or "tuple"
(a multi-output node, read through getitem). Sibling groups that feed one op merge when no path
between them leaves both. Everything else — GEMMs, convolutions, pooling, scans, other views —
stays a single-node unit (run by the library or by a node template).

Units are ordered topologically over their dependencies, so a group runs after all its inputs
exist and before any of its outputs are read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.capture.shapes import contiguous_strides, refine_strides
from kernelwright.ops import (COMPOSITES, CONVS, EVAL_BN, FLOAT_DTYPES, FREE_VIEWS, GEMMS, NORMS, POINTWISE, POOLS,
                              REDUCTIONS, RESHAPES, layout_clone, reduction_spec, row_shapes)


@dataclass
class Group:
    id: str
    nodes: list[str]
    domain: tuple[int, ...]
    rdims: tuple[int, ...] | None  # reduced dims of the domain; None for a pure pointwise group
    levels: dict[str, str] = field(default_factory=dict)  # value name -> "full" | "row" | "row_b" | "tuple"
    inputs: list[str] = field(default_factory=list)  # external values read, first-use order
    outputs: list[str] = field(default_factory=list)  # values read outside the group
    normalizes: bool = False  # domain-shaped values are computed from per-row statistics

    @property
    def kind(self) -> str:
        """pointwise; reduction (values per kept index); normalization (domain-shaped values
        computed after a reduction, e.g. softmax or a norm)."""
        if self.rdims is None:
            return "pointwise"
        return "normalization" if self.normalizes else "reduction"

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "nodes": self.nodes, "domain": list(self.domain),
                "rdims": None if self.rdims is None else list(self.rdims), "inputs": self.inputs, "outputs": self.outputs}


@dataclass
class Unit:
    """One step of the program: a fusion group, or a single node run by the library."""

    group: Group | None = None
    node: str | None = None

    @property
    def name(self) -> str:
        return self.group.id if self.group else self.node

    @property
    def nodes(self) -> list[str]:
        """The graph nodes this unit runs."""
        return self.group.nodes if self.group else [self.node]

    @property
    def outputs(self) -> list[str]:
        """The values this unit produces for the rest of the program."""
        return list(self.group.outputs) if self.group else [self.node]


@dataclass
class Pair:
    """A GEMM or convolution node and the fusion group that alone reads its result: a unit of its
    own whose choices are the two run one after the other (the node's chosen implementation and
    the group's chosen kernel) or one GEMM / convolution template with the group as its epilogue
    (codegen/gemm_epilogue.py and codegen/conv_epilogue.py say which groups they take).

    A convolution pair may go on through pooling: `pools` are the pooling nodes that follow the
    group (or the convolution itself, with no group) one after the other, each read only through its
    first output, and `post` the pointwise group that alone reads the last pool. Such a chain is
    one more choice: the convolution computes it all and writes the pooled result only.

    A convolution pair's group may also be a reduction that reads its result beside other units (the
    statistics of a norm that plan.norm_split splits before a pool): the convolution then writes its
    result for those units and the statistics come from its tiles (codegen/conv_norm.py), the
    group's unit running before every other reader of the result."""

    anchor: str  # the GEMM or convolution node
    group: Group | None  # None: a convolution read by its first pool alone
    kind: str = "gemm"  # "gemm" | "conv"
    pools: tuple[str, ...] = ()  # pooling nodes after the group and the getitems reading them (convolutions only)
    post: Group | None = None  # the group that alone reads the last pool

    @property
    def units(self) -> list[str]:
        """The plan units the pair computes, in program order (a pool's getitem is a unit too)."""
        first = [self.anchor] + ([self.group.id] if self.group is not None else [])
        return first + list(self.pools) + ([self.post.id] if self.post else [])

    @property
    def name(self) -> str:
        last = self.post.id if self.post is not None else self.pools[-1] if self.pools else None
        head = f"{self.group.id}+{self.anchor}" if self.group is not None else self.anchor
        return head if last is None else f"{last}+{head}"


@dataclass
class PoolChain:
    """A pooling node with the pointwise group that alone computes its input (`pre`: applied to
    every window element as the pool reads it) and/or the pointwise group that alone reads its
    result (`post`: applied to every pooled value). One more choice for these units: one pooling
    kernel that reads `pre`'s inputs (a library convolution's output, a bias) and writes `post`'s
    result, so neither the pool's input nor its output goes through memory."""

    pool: str
    read: str | None  # the getitem reading a max pool's values (None for an avg pool)
    pre: Group | None
    post: Group | None
    into: tuple[str, ...] = ()  # unsqueezes from pre's output to the pool's input (a 1-D pool)
    out_of: tuple[str, ...] = ()  # squeezes from the pooled value to what post reads

    @property
    def units(self) -> list[str]:
        """The plan units the chain computes, in program order."""
        return (([self.pre.id] if self.pre else []) + list(self.into) + [self.pool] + ([self.read] if self.read else [])
                + list(self.out_of) + ([self.post.id] if self.post else []))

    @property
    def name(self) -> str:
        return "+".join(u for u in (self.post.id if self.post else None, self.pool,
                                    self.pre.id if self.pre else None) if u)

    @property
    def out(self) -> str:
        """The value the chain produces."""
        return self.post.outputs[0] if self.post else self.read or self.pool


@dataclass
class Plan:
    graph: Graph
    units: list[Unit]
    pairs: list[Pair] = field(default_factory=list)  # searched after the units they join
    chains: list[PoolChain] = field(default_factory=list)  # searched after the units, before the pairs

    @property
    def groups(self) -> list[Group]:
        return [u.group for u in self.units if u.group]


def anchor_pairs(graph: Graph, units: list[Unit]) -> list[Pair]:
    """Each GEMM or convolution unit whose every reader is in one fusion group, with that group;
    and each convolution whose result (or its group's) goes on through pooling (Pair.pools), as a
    pair of its own searched after the plain one."""
    groups = [u.group for u in units if u.group]

    def reader_group(value: str) -> Group | None:
        users = {u.name for u in graph.users(value)}
        return next((g for g in groups if users and users <= set(g.nodes)), None)

    owner = {n: i for i, u in enumerate(units) for n in u.nodes}  # node -> its unit's index
    pairs = []
    for unit in units:
        target = graph.node(unit.node).target if unit.node is not None else None
        if target not in GEMMS and target not in CONVS:
            continue
        group = reader_group(unit.node)
        if group is not None:
            pairs.append(Pair(unit.node, group, "gemm" if target in GEMMS else "conv"))
        elif target in CONVS and (stats := _statistics_group(graph, unit.node, units, owner)) is not None:
            pairs.append(Pair(unit.node, stats, "conv"))
        if target in CONVS:
            head = group if group is not None and len(group.outputs) == 1 else None
            value = head.outputs[0] if head is not None else unit.node if group is None else None
            pools, value = _pool_chain(graph, value) if value is not None else ((), None)
            if pools:
                post = reader_group(value)
                pairs.append(Pair(unit.node, head, "conv", pools,
                                  post if post is not None and post.rdims is None else None))
    return pairs


def _statistics_group(graph: Graph, value: str, units: list[Unit], owner: dict[str, int]) -> Group | None:
    """The one reduction group among the readers of `value` (a convolution's result) whose every
    output is smaller than it, where its unit comes before the unit of every other reader (`owner`:
    each node's unit index)."""
    readers = {owner[u.name] for u in graph.users(value) if u.name in owner}
    found = [i for i in readers if units[i].group is not None and units[i].group.rdims is not None
             and all(graph.meta(v).numel < graph.meta(value).numel for v in units[i].group.outputs)]
    if len(found) != 1 or any(i < found[0] for i in readers):
        return None
    return units[found[0]].group


def _pool_chain(graph: Graph, value: str) -> tuple[tuple[str, ...], str | None]:
    """The pooling nodes of one kind that read `value` one after the other, each the only reader
    of its input and read only through its first output (with those getitem nodes, in program
    order); and the last one's result."""
    pools: list[str] = []
    kind = None
    while value not in graph.outputs and value not in graph.mutations:
        users = graph.users(value)
        if len(users) != 1 or users[0].target not in POOLS or (kind and POOLS[users[0].target][0] != kind):
            break
        pool = users[0]
        kind = POOLS[pool.target][0]
        if pool.target.endswith("_with_indices.default"):
            reads = graph.users(pool.name)
            if len(reads) != 1 or reads[0].target != "getitem" or reads[0].args[1] != 0:
                break
            pools += [pool.name, reads[0].name]
            value = reads[0].name
        else:
            pools.append(pool.name)
            value = pool.name
    return tuple(pools), (value if pools else None)


UNSQUEEZES = ("aten.unsqueeze.default",)
SQUEEZES = ("aten.squeeze.dims", "aten.squeeze.dim")
LAYOUT_COPIES = ("aten.clone.default", "aten._to_copy.default")


def _reaches(graph: Graph, value: str, arrived: Callable[[OpNode, str], bool | None], through: tuple) -> bool:
    """Whether `value` reaches a node `arrived` answers for (True / False; None: not such a node)
    through elementwise ops and the `through` targets, each the only reader of the last."""
    while value not in graph.outputs and value not in graph.mutations:
        users = graph.users(value)
        if len(users) != 1:
            return False
        user = users[0]
        if (hit := arrived(user, value)) is not None:
            return hit
        if not _is_pointwise(user, graph) and user.target not in through:
            return False
        value = user.name
    return False


def feeds_pool(graph: Graph, value: str) -> bool:
    """Whether `value` reaches a pool through elementwise ops (and the unsqueezes before a 1-D
    pool), each the only reader of the last."""
    return _reaches(graph, value, lambda user, v: True if user.target in POOLS else None, UNSQUEEZES)


def feeds_conv(graph: Graph, value: str) -> bool:
    """Whether `value` reaches a convolution's input through elementwise ops, layout copies and
    casts, each the only reader of the last: values a convolution kernel can compute as it loads
    its input (codegen/conv_epilogue.py, the template's prologue)."""
    return _reaches(graph, value, lambda user, v: (bool(user.args) and user.args[0] == Ref(v))
                    if user.target in CONVS else None, LAYOUT_COPIES)


def _views(graph: Graph, value: str, targets: tuple, up: bool) -> tuple[str, list[str]]:
    """(the value past them, the views) of the chain of `targets` views around `value`: up, the
    views `value` is made by from another value; down, those made from it; each view the only
    reader of the value before it, none escaping."""
    escaping = set(graph.outputs) | set(graph.mutations)
    views: list[str] = []
    while True:
        if up:
            if graph.is_input(value) or graph.node(value).target not in targets or value in escaping:
                return value, views
            src = graph.node(value).args[0].name
            if len(graph.users(src)) != 1:
                return value, views
            views.insert(0, value)
            value = src
        else:
            users = graph.users(value)
            if len(users) != 1 or users[0].target not in targets or value in escaping or users[0].name in escaping:
                return value, views
            value = users[0].name
            views.append(value)


def _views_domain(shape, domain) -> bool:
    """Whether a contiguous tensor of `shape` can be read as the domain by a view (split/merge)."""
    return len(shape) > 0 and refine_strides(tuple(shape), contiguous_strides(shape), tuple(domain)) is not None


def _layout_copy(node: OpNode) -> bool:
    """A copy into another memory format (a convolution's channels-last input): a clone, or a cast
    between float dtypes made with it (the bf16 policy's operand cast)."""
    if node.meta is None or not node.args or not isinstance(node.args[0], Ref):
        return False
    if node.target == "aten.clone.default":
        return layout_clone(node)
    return (node.target == "aten._to_copy.default" and "memory_format" in node.kwargs
            and set(node.kwargs) <= {"dtype", "memory_format"} and node.meta.dtype in FLOAT_DTYPES)


def _is_pointwise(node: OpNode, graph: Graph) -> bool:
    if node.target not in POINTWISE or node.meta is None:
        return False
    if node.target == "aten._to_copy.default":  # only casts between float dtypes, nothing else changed
        src = graph.meta(node.args[0].name) if isinstance(node.args[0], Ref) else None
        return (set(node.kwargs) <= {"dtype"} and src is not None and src.dtype in FLOAT_DTYPES
                and node.meta.dtype in FLOAT_DTYPES)
    return node.meta.dtype in FLOAT_DTYPES or node.meta.dtype == "bool"


class _Builder:
    def __init__(self, graph: Graph):
        self.g = graph
        self.groups: list[Group] = []
        self.owner: dict[str, Group] = {}
        self.deps: dict[str, set[str]] = {i.name: set() for i in graph.inputs}
        self._next_id = 0

    def _can_join(self, n: OpNode, g: Group) -> str | None:
        """The level n's value would have in g, or None if n cannot join g."""
        for i in n.inputs:
            if self.owner.get(i) is not g and g.id in self.deps.get(i, set()):
                return None  # joining would create a cycle through a unit outside g
        if n.target == "getitem":
            src = n.args[0].name
            if self.owner.get(src) is not g:
                return None
            t = self.g.node(src).target
            if t == EVAL_BN:
                return "full" if n.args[1] == 0 else None
            if t in NORMS:
                return "full" if n.args[1] == 0 else "row"
            return "row"  # max.dim / min.dim values and indices
        if n.target in FREE_VIEWS:
            return self._view_level(n, g)
        if _layout_copy(n):
            # the group writes its value in the copy's layout (channels-last for a library
            # convolution), instead of a second kernel reading it back to copy it. Not a reduction
            # group that also writes the value itself (the forward returns it in eager's layout):
            # its schedule walks one layout, and a second written in another scatters its stores
            # (the training ResNet block's batch norm + ReLU writing relu for the backward and
            # relu_cl for the next convolution took 0.706 ms on an H100 where the second one,
            # writing two values in one layout, took 0.369, and a layout copy of the same size
            # alone 0.072: docs/benchmarks.md "Training through the backend")
            x = n.args[0].name
            ok = self.owner.get(x) is g and g.levels[x] == "full" and tuple(n.meta.shape) == tuple(g.domain)
            returned = x in self.g.outputs or x in self.g.mutations
            return "full" if ok and not (g.rdims is not None and returned) else None
        if n.target == EVAL_BN:
            x = n.args[0]
            meta = self.g.meta(x.name) if hasattr(x, "name") else None
            if meta is None or meta.dtype not in FLOAT_DTYPES or tuple(meta.shape) != tuple(g.domain):
                return None
            if self.owner.get(x.name) is g and g.levels[x.name] != "full":
                return None
            if any(u.target != "getitem" or u.args[1] != 0 for u in self.g.users(n.name)):
                return None  # its (empty) statistics outputs are read: leave it to the library
            return "tuple"
        spec = reduction_spec(n, self.g) if n.target in REDUCTIONS | COMPOSITES else None
        if spec is not None:
            dom, rd, _ = spec
            x = n.args[0].name
            if dom != g.domain or (g.rdims is not None and g.rdims != rd):
                return None
            if self.owner.get(x) is g and g.levels[x] != "full":
                return None
            return "tuple" if n.target in {"aten.max.dim", "aten.min.dim"} | NORMS else (
                "full" if n.target in COMPOSITES else "row")
        if not _is_pointwise(n, self.g):
            return None
        shape = n.meta.shape
        in_group = [i for i in n.inputs if self.owner.get(i) is g]
        if shape != g.domain and _views_domain(shape, g.domain) and all(g.levels[i] == "full" for i in in_group):
            return "full"  # e.g. an activation on group norm's [N, C, H, W] output, domain [N, G, C/G, H*W]
        if shape == g.domain:
            for i in in_group:
                if g.levels[i] == "row" and len(self.g.meta(i).shape) != len(g.domain):
                    return None
                if g.levels[i] in ("row", "row_b") and g.rdims is not None and len(g.rdims) == len(g.domain):
                    return None  # after a reduction to one value, a second kernel reads it as a scalar
            if self._applies_pool_stats(n.name, g):
                return None  # the apply after the statistics: the pool's prologue (PoolChain) computes it
            return "full"
        if g.rdims is not None and shape in row_shapes(g.domain, g.rdims):
            if all(g.levels[i] == "row" and self.g.meta(i).shape == shape for i in in_group):
                return "row"
        return None

    def _mergeable(self, a: Group, b: Group) -> bool:
        """Two groups feeding one op merge when they share the domain and no path between them
        leaves both (which would make one kernel wait on its own output). An elementwise-only group
        b also folds into a reduction group a over a regrouped view of b's domain (a conv's bias
        add before a group norm over [N, G, C/G, H*W]): b's values are read through that view."""
        regroup = (a.domain != b.domain and a.rdims is not None and b.rdims is None
                   and all(v == "full" for v in b.levels.values()) and _views_domain(b.domain, a.domain)
                   and all(self.g.node(n).target in POINTWISE or self.g.node(n).target in RESHAPES for n in b.nodes))
        if regroup:
            return self._acyclic(a, b)
        if a.domain != b.domain or (a.rdims is not None and b.rdims is not None and a.rdims != b.rdims):
            return False
        if self._pool_apply(a, b) or self._pool_apply(b, a):
            return False  # the apply after the statistics stays apart: the pool's prologue computes it
        rd = a.rdims if a.rdims is not None else b.rdims
        if rd is not None and len(rd) == len(a.domain) and (a.rdims is None or b.rdims is None):
            return False  # elementwise work after a reduction to one value stays a separate kernel
        return self._acyclic(a, b)

    def _row_prologue(self, a: Group, b: Group) -> bool:
        """Whether elementwise group `b` computes values of one per row of reduction group `a`
        from per-row operands only (a batch norm backward's invstd * invstd, [C] beside its sums
        over [N, C, H, W]): a folds it in at the row level, computing it beside its own
        row values instead of a kernel launch of its own for a few elements."""
        if a.rdims is None or b.rdims is not None or any(v != "full" for v in b.levels.values()):
            return False
        rows = row_shapes(a.domain, a.rdims)
        if tuple(b.domain) not in rows or tuple(b.domain) == tuple(a.domain):
            return False
        for name in b.nodes:
            node = self.g.node(name)
            if not _is_pointwise(node, self.g) or tuple(node.meta.shape) != tuple(b.domain):
                return False
            if any(self.owner.get(i) not in (a, b) and ((m := self.g.meta(i)) is None or tuple(m.shape) not in rows + ((),))
                   for i in node.inputs):
                return False
        return self._acyclic(a, b)

    def _sibling_reduction(self, n: OpNode) -> tuple[Group, str] | None:
        """For a reduction of a value no group computes (a library op's result): the reduction
        group over the same dims that already reduces that value (a mean and a variance of one
        tensor), so one kernel reads it once. None otherwise."""
        spec = reduction_spec(n, self.g) if n.target in REDUCTIONS else None
        if spec is None or not isinstance(n.args[0], Ref) or n.args[0].name in self.owner:
            return None
        x = n.args[0].name
        for g in self.groups:
            if g.rdims == spec[1] and g.domain == spec[0] and not g.normalizes and any(
                    self.g.node(m).target in REDUCTIONS and self.g.node(m).args[0] == Ref(x) for m in g.nodes):
                level = self._can_join(n, g)
                if level is not None:
                    return g, level
        return None

    def _pool_apply(self, pw: Group, red: Group) -> bool:
        """Whether elementwise group `pw` holds a node that applies statistics of reduction group
        `red` to values going on into a pool (_applies_pool_stats): kept apart."""
        return pw.rdims is None and any(self._applies_pool_stats(name, red) for name in pw.nodes)

    def _applies_pool_stats(self, name: str, red: Group) -> bool:
        """Whether node `name` reads a per-row value of reduction group `red` and its result goes on
        into a pool (feeds_pool), or, for per-channel statistics (a training batch norm's), into a
        convolution (feeds_conv): that apply is the pool chain's or the convolution's prologue, not
        part of `red`."""
        if red.rdims is None:
            return False
        per_channel = len(red.domain) >= 3 and set(red.rdims) == set(range(len(red.domain))) - {1}
        return (feeds_pool(self.g, name) or (per_channel and feeds_conv(self.g, name))) and any(
            self.owner.get(i) is red and red.levels.get(i) in ("row", "row_b") for i in self.g.node(name).inputs)

    def _acyclic(self, a: Group, b: Group) -> bool:
        """No path from one group to the other leaves both."""
        for x, y in ((a, b), (b, a)):
            for name in x.nodes:
                for i in self.g.node(name).inputs:
                    if self.owner.get(i) not in (x, y) and y.id in self.deps.get(i, set()):
                        return False
        return True

    def _merge(self, a: Group, b: Group, level: str | None = None):
        """Fold group b into group a (node order stays topological); `level`: the level b's values
        take in a (by default the one they had in b)."""
        pos = {n.name: k for k, n in enumerate(self.g.nodes)}
        a.nodes = sorted(a.nodes + b.nodes, key=pos.get)
        a.levels.update({k: level or v for k, v in b.levels.items()})
        a.normalizes = a.normalizes or b.normalizes
        if a.rdims is None:
            a.rdims = b.rdims
        for name in b.nodes:
            self.owner[name] = a
        for deps in self.deps.values():
            if b.id in deps:
                deps.discard(b.id)
                deps.add(a.id)
        self.groups.remove(b)

    def _view_level(self, n: OpNode, g: Group) -> str | None:
        """Views that only re-label a group value: expand of a row value (or a same-shape value)
        to the domain, and squeeze/unsqueeze/view between a row value's keepdim and flat forms."""
        src = n.args[0]
        if not hasattr(src, "name") or self.owner.get(src.name) is not g or n.meta is None:
            return None
        level, shape, src_shape = g.levels[src.name], tuple(n.meta.shape), tuple(self.g.meta(src.name).shape)
        rows = row_shapes(g.domain, g.rdims) if g.rdims is not None else ()
        if n.target == "aten.expand.default":
            if shape != g.domain:
                return None
            if level == "full" and src_shape == g.domain:
                return "full"
            if level == "row" and rows and src_shape == rows[0]:
                return "row_b"  # a row value standing for its broadcast over the domain
            return None
        if level == "row" and rows and shape in rows and src_shape in rows:
            return "row"
        if level == "full" and shape == src_shape == g.domain:
            return "full"
        if level == "full" and n.target in RESHAPES \
                and (src_shape == g.domain or _views_domain(src_shape, g.domain)) and _views_domain(shape, g.domain):
            # a reshape between two views of the domain (a GEMM's [B*S, N] result and its [B, S, N]
            # form): element i of one is element i of the other in row-major order, as in the domain
            return "full"
        return None

    def add(self, n: OpNode):
        fusible = n.target in FREE_VIEWS or n.target == "getitem" or n.target == EVAL_BN or n.target in COMPOSITES or (
            n.target in REDUCTIONS and reduction_spec(n, self.g) is not None) or _is_pointwise(n, self.g) or (
            _layout_copy(n) and n.args[0].name in self.owner)  # (joins its input's group; alone: a node)
        target = None
        if fusible:
            for i in n.inputs:
                g = self.owner.get(i)
                if g is not None and (level := self._can_join(n, g)) is not None:
                    target = (g, level)
                    break
        deps = set().union(*(self.deps.get(i, set()) for i in n.inputs)) if n.inputs else set()
        if target is None and fusible:
            target = self._sibling_reduction(n)
        if target is None and fusible and n.target != "getitem":
            spec = reduction_spec(n, self.g) if n.target in REDUCTIONS | COMPOSITES else None
            dom, rd = (spec[0], spec[1]) if spec else (n.meta.shape, None)
            g = Group(f"g{self._next_id}", [], dom, rd)
            self._next_id += 1
            self.groups.append(g)
            target = (g, self._can_join(n, g))
            if target[1] is None:  # e.g. a reduction over a non-float input
                self.groups.pop()
                target = None
        if target is None:
            self.deps[n.name] = deps | {n.name}
            return
        g, level = target
        if spec := (reduction_spec(n, self.g) if n.target in REDUCTIONS | COMPOSITES else None):
            g.rdims = spec[1]
        if n.target in COMPOSITES or (level == "full" and any(v in ("row", "tuple") for v in g.levels.values())):
            g.normalizes = True
        g.nodes.append(n.name)
        g.levels[n.name] = level
        self.owner[n.name] = g
        self.deps[n.name] = deps | {g.id}
        for i in n.inputs:  # n joins siblings: fold the other producer groups in where that is safe
            other = self.owner.get(i)
            if other is None or other is g:
                continue
            if self._mergeable(g, other):
                self._merge(g, other)
            elif self._row_prologue(g, other):
                self._merge(g, other, level="row")
            elif self._row_prologue(other, g):
                self._merge(other, g, level="row")
                g = other


def plan_graph(graph: Graph) -> Plan:
    """Fusion groups and the unit order for `graph`."""
    b = _Builder(graph)
    for n in graph.nodes:
        b.add(n)
    outside_reads: dict[str, set[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            outside_reads.setdefault(i, set()).add(b.owner[n.name].id if n.name in b.owner else n.name)
    escaping = set(graph.outputs) | set(graph.mutations)
    for g in b.groups:
        members = set(g.nodes)
        for name in g.nodes:
            node = graph.node(name)
            for i in node.inputs:
                if i not in members and i not in g.inputs:
                    g.inputs.append(i)
            if g.levels[name] != "tuple" and (name in escaping or outside_reads.get(name, set()) - {g.id}):
                g.outputs.append(name)
    units = _order_units(graph, b)
    return Plan(graph, units, anchor_pairs(graph, units), pool_chains(graph, units))


def pool_chains(graph: Graph, units: list[Unit]) -> list[PoolChain]:
    """Each pooling unit read only through its values (a max pool's indices unread) with a
    pointwise group of one output that only it reads before it, or a pointwise group of one
    output that alone reads it after it, or both (PoolChain)."""
    groups = [u.group for u in units if u.group]
    escaping = set(graph.outputs) | set(graph.mutations)
    chains = []
    for unit in units:
        node = graph.node(unit.node) if unit.node is not None else None
        if node is None or node.target not in POOLS or not node.args or not isinstance(node.args[0], Ref):
            continue
        read, value = None, node.name
        if node.target.endswith("_with_indices.default"):
            reads = graph.users(node.name)
            if len(reads) != 1 or reads[0].target != "getitem" or reads[0].args[1] != 0:
                continue
            read = value = reads[0].name
        x, into = _views(graph, node.args[0].name, UNSQUEEZES, up=True)  # (a 1-D pool's views)
        pre = next((g for g in groups if g.rdims is None and g.outputs == [x]), None)
        if pre is not None and (x in escaping or [u.name for u in graph.users(x)] != [(into or [node.name])[0]]):
            pre = None
        value, out_of = _views(graph, value, SQUEEZES, up=False)
        users = {u.name for u in graph.users(value)}
        post = None if value in escaping or not users else \
            next((g for g in groups if g.rdims is None and len(g.outputs) == 1 and users <= set(g.nodes)), None)
        if pre is not None or post is not None:
            chains.append(PoolChain(node.name, read, pre, post, tuple(into) if pre else (),
                                    tuple(out_of) if post else ()))
    return chains


def _order_units(graph: Graph, b: _Builder) -> list[Unit]:
    """Topological order of units (Kahn's algorithm, ties broken by first node position)."""
    unit_of: dict[str, str] = {}
    units: dict[str, Unit] = {}
    first: dict[str, int] = {}
    for pos, n in enumerate(graph.nodes):
        key = b.owner[n.name].id if n.name in b.owner else n.name
        unit_of[n.name] = key
        if key not in units:
            units[key] = Unit(group=b.owner[n.name]) if n.name in b.owner else Unit(node=n.name)
            first[key] = pos
    preds: dict[str, set[str]] = {k: set() for k in units}
    for n in graph.nodes:
        for i in n.inputs:
            if i in unit_of and unit_of[i] != unit_of[n.name]:
                preds[unit_of[n.name]].add(unit_of[i])
    order, done = [], set()
    ready = sorted((k for k in units if not preds[k]), key=first.get)
    while ready:
        k = ready.pop(0)
        order.append(units[k])
        done.add(k)
        for j in units:
            if j not in done and j not in ready and preds[j] <= done:
                ready.append(j)
        ready.sort(key=first.get)
    if len(order) != len(units):
        raise RuntimeError("fusion produced a cycle between units")  # guarded against in _can_join
    return order
