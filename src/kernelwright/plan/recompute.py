"""Cheap elementwise values recomputed by their readers instead of stored by a reduction kernel.

A reduction group whose domain-sized elementwise value another group reads (a decomposed batch
norm backward: ``where(mask, 0, grad)`` and ``x - mean`` feed both the per-channel sums and the
elementwise gradient after them, a kernel of its own because the per-channel values reach it
through views) writes that value out in full and the reader reads it back: two passes over the
domain and a domain-sized buffer alive between the kernels. When the value is a few elementwise
ops on tensors the reader can load itself, the reader computes it again from them instead (as
Inductor does): the reduction kernel then writes per-row values only (and may split its rows), and
the reader loads the operands, at most a few bytes more per element than the value itself.

Off by default (pipeline.Options.recompute): two A/B runs of the ResNet block's training step on the
H100 disagree (docs/benchmarks.md, "Training layouts": the steps are bound by host time there).

`recompute_reads(graph)` plans the graph once (plan.fusion), and for each such value gives every
reading group a copy of the value's elementwise closure (nodes named ``{name}_re{k}``, placed just
before the group's first node that reads the value), so the plan made afterwards fuses each copy into
its reader.
"""
from __future__ import annotations

import math

from kernelwright.analyze.cost import consumers
from kernelwright.capture.graph import Graph, OpNode, reading
from kernelwright.plan.fusion import Group, _is_pointwise, plan_graph

MAX_OPS = 8  # elementwise ops a reader computes again per value
MAX_EXTRA = 2.0  # bytes per element the reader may load beyond the value's own, relative to its itemsize


def _closure(graph: Graph, value: str, grp: Group) -> list[str] | None:
    """The nodes of `grp` that compute `value` from operands outside the group, in graph order,
    when they are all domain-level elementwise ops (None otherwise, or past MAX_OPS)."""
    members, out, todo = set(grp.nodes), set(), [value]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        node = graph.node(name)
        if grp.levels.get(name) != "full" or not _is_pointwise(node, graph):
            return None
        out.add(name)
        todo += [i for i in node.inputs if i in members]
        if len(out) > MAX_OPS:
            return None
    return [n for n in grp.nodes if n in out]


def _operands(graph: Graph, closure: list[str]) -> set[str]:
    inside = set(closure)
    return {i for n in closure for i in graph.node(n).inputs if i not in inside}


def _per_element(graph: Graph, names, domain) -> float:
    """Bytes per domain element of loading `names` (a broadcast operand costs almost nothing)."""
    n = max(math.prod(domain), 1)
    return sum(m.numel * m.itemsize / n for m in map(graph.meta, names) if m is not None)


def recompute_reads(graph: Graph) -> tuple[Graph, list[str]]:
    """`graph` with the copies described in the module docstring, and one note per value."""
    plan = plan_graph(graph)
    owner = {n: g for g in plan.groups for n in g.nodes}
    readers = consumers(graph)
    keep = set(graph.outputs) | set(graph.mutations)
    copies: dict[str, list[tuple[str, list[str]]]] = {}  # reader group id -> (value, closure)
    notes = []
    for a in plan.groups:
        if a.rdims is None:
            continue
        for value in [n for n in a.nodes if a.levels.get(n) == "full"]:
            outside = [r for r in readers.get(value, []) if owner.get(r.name) is not a]
            if not outside or value in keep:
                continue
            groups = list({id(g): g for g in (owner.get(r.name) for r in outside)}.values())
            if None in groups or any(g.rdims is not None or tuple(g.domain) != tuple(a.domain) for g in groups):
                continue  # a library node reads it, or a group over another domain
            closure = _closure(graph, value, a)
            if closure is None:
                continue
            meta = graph.meta(value)
            operands = _operands(graph, closure)
            if any(graph.meta(o) is None for o in operands):
                continue
            for g in groups:
                extra = _per_element(graph, operands - set(g.inputs), a.domain)
                if extra > MAX_EXTRA * meta.itemsize:
                    break
            else:
                for g in groups:
                    copies.setdefault(g.id, []).append((value, closure))
                notes.append(f"{value} ({', '.join(graph.node(n).op for n in closure)}): computed again where "
                             f"it is read, not stored by its reduction kernel")
    if not copies:
        return graph, []
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    before: dict[str, list[OpNode]] = {}  # a node -> the copies placed just before it
    renames: dict[str, dict[str, str]] = {}  # reader group id -> closure node -> its copy
    k = 0
    for g in plan.groups:
        if g.id not in copies:
            continue
        mapping: dict[str, str] = {}
        # each value's copies go before its first reader in the group (its operands are defined
        # by then); a copy two values share, before the earlier of the two
        firsts = [(min((n for n in g.nodes if value in graph.node(n).inputs), key=pos.get), closure)
                  for value, closure in copies[g.id]]
        for at, closure in sorted(firsts, key=lambda fc: pos[fc[0]]):
            for name in closure:
                if name in mapping:
                    continue
                k += 1
                mapping[name] = f"{name}_re{k}"
                node = graph.node(name)
                before.setdefault(at, []).append(
                    reading(OpNode(mapping[name], node.target, node.args, node.kwargs, list(node.outs)), mapping))
        renames[g.id] = mapping
    reader_of = {n: g.id for g in plan.groups if g.id in renames for n in g.nodes}
    nodes: list[OpNode] = []
    for n in graph.nodes:
        nodes += before.get(n.name, [])
        gid = reader_of.get(n.name)
        nodes.append(reading(n, renames[gid]) if gid is not None else n)
    return Graph(graph.name, graph.inputs, nodes, list(graph.outputs), dict(graph.mutations), graph.exported), notes
