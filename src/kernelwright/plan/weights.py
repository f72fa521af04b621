"""Values that depend on the model's parameters alone (a weight transposed, cast to bf16, copied
channels-last): the emitted forward computes them once per parameter version and reuses them
(emit/program.py), as autocast's cast cache does within one region, and a fused kernel reads such
a value rather than redoing its cast on every tile (codegen/gemm_epilogue.py)."""
from __future__ import annotations

from kernelwright.capture.graph import Graph

# ops whose result is not a function of their arguments alone
_IMPURE = ("rand", "bernoulli", "dropout", "normal", "uniform", "exponential", "multinomial", "empty")


def weight_roots(graph: Graph) -> dict[str, tuple[str, ...]]:
    """value -> the parameters (graph input names) it is computed from, for every node computed
    from parameters and constants only through pure ops; parameters map to themselves."""
    roots: dict[str, tuple[str, ...]] = {i.name: (i.name,) for i in graph.inputs if i.kind == "param"}
    roots.update({i.name: () for i in graph.inputs if i.kind == "constant"})
    for n in graph.nodes:
        if any(w in n.target for w in _IMPURE) or n.target.split(".")[1:2] and n.target.split(".")[1].endswith("_"):
            continue
        ins = n.inputs
        if ins and all(v in roots for v in ins):
            roots[n.name] = tuple(dict.fromkeys(r for v in ins for r in roots[v]))
    return roots
