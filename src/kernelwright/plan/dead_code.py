"""Nodes a rewrite left unread, dropped (plan.rewrites.narrow_through_views, plan.attention)."""
from __future__ import annotations

from kernelwright.capture.graph import Graph, OpNode
from kernelwright.plan.weights import pure


def drop_unread(graph: Graph, nodes: list[OpNode], among: set[str] | None = None) -> list[OpNode]:
    """`nodes` (a rewrite of `graph`'s) without the pure nodes nothing reads, never a value
    `graph` returns or a buffer it updates; with `among`, only those names may go (values a
    rewrite passed through may still feed other readers: they stay either way)."""
    keep = set(graph.outputs) | set(graph.mutations)
    while True:
        read = {name for n in nodes for name in n.inputs}
        alive = [n for n in nodes if n.name in read or n.name in keep or not pure(n.target)
                 or (among is not None and n.name not in among)]
        if len(alive) == len(nodes):
            return nodes
        nodes = alive
