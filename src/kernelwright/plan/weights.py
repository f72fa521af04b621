"""Values that depend on the model's parameters alone (a weight transposed, cast to bf16, copied
channels-last, a batch norm folded into a convolution's weight; a causal mask taken from a buffer
the forward never writes): the emitted forward computes them first on every call, from the live
parameters (emit/program.py), and a fused kernel reads such a value rather than redoing its cast
on every tile (codegen/gemm_epilogue.py)."""
from __future__ import annotations

from kernelwright.capture.graph import Graph

# ops whose result is not a function of their arguments alone
_IMPURE = ("rand", "bernoulli", "dropout", "normal", "uniform", "empty", "exponential", "multinomial")


def pure(target: str) -> bool:
    """Whether an ATen op's result is a function of its arguments alone: not random, not an
    allocation, not in-place (`aten.add_.Tensor`)."""
    op = target.split(".")
    return not any(w in target for w in _IMPURE) and not (len(op) > 1 and op[1].endswith("_"))


def weight_roots(graph: Graph) -> dict[str, tuple[str, ...]]:
    """value -> the parameters (graph input names) it is computed from, for every node computed
    from parameters and constants only through pure ops; parameters map to themselves. Buffers the
    forward does not update (a registered mask) and plain tensor attributes count as parameters;
    buffers it writes (running statistics) do not."""
    written = set(graph.mutations.values())
    roots: dict[str, tuple[str, ...]] = {i.name: (i.name,) for i in graph.inputs if i.kind in ("param", "attribute")
                                         or (i.kind == "buffer" and i.fqn not in written)}
    roots.update({i.name: () for i in graph.inputs if i.kind == "constant"})
    for n in graph.nodes:
        if not pure(n.target):
            continue
        ins = n.inputs
        if ins and all(v in roots for v in ins):
            roots[n.name] = tuple(dict.fromkeys(r for v in ins for r in roots[v]))
    return roots


def weight_only(graph: Graph, outputs: list[str], roots: dict[str, tuple[str, ...]] | None = None) -> bool:
    """Whether a unit with these outputs computes values of the parameters alone (`weight_roots`),
    none of them returned: such a unit works on weights, not activations (emit/program.py computes
    it first on every call), so the search spends on it one trial."""
    roots = weight_roots(graph) if roots is None else roots
    return bool(outputs) and all(o in roots and o not in graph.outputs for o in outputs)
