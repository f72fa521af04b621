"""A pooling node with its pointwise neighbours in one kernel (plan.PoolChain): the pool template
(templates/triton/pool.py.j2) with the group that computes its input as a prologue and the group
that reads its result as an epilogue.

The prologue runs on every window element as the pool reads it: each operand of the group is
loaded at that element's (n, c, d, h, w) through its own strides (a per-channel or 0-d operand
once per output, before the window loop), the group's statements run, and padding positions get
the pool's neutral value afterwards (-inf for max, 0 for avg), as if the group's output had been
written and then pooled. The epilogue runs on the pooled value at the output's (n, c, od, oh, ow)
the same way. A bf16 value between the stages is rounded as its store would round it, so the
chain computes what the separate kernels compute. Overlapping windows recompute the prologue of a
shared element: cheap pointwise work against a pass over memory saved. A 1-D pool is captured as
unsqueeze -> 2-D pool -> squeeze: the chain takes those views in too, its stages indexing the
groups' own [N, C, L] values with the variables of the dims the views leave.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelwright.capture.graph import Graph, TensorMeta
from kernelwright.codegen.conv_epilogue import stage_lines
from kernelwright.codegen.node_kernels import NodeKernel, used_outputs
from kernelwright.codegen.triton_group import Unsupported
from kernelwright.codegen.triton_pool import TEMPLATE, render_pool
from kernelwright.ops import POOLS
from kernelwright.plan.fusion import Group, PoolChain

_DTYPES = ("float32", "bfloat16")
_LOOP = " " * 16  # the window loop's body in the template
_TOP = " " * 4


@dataclass
class ChainKernel:
    """What the chain kernel reads and writes, checked once (`build`), rendered per config."""

    graph: Graph
    chain: PoolChain
    inputs: list[str]  # graph values passed to launch(), in order
    names: list[str]  # their names in the kernel (pointer `{name}_ptr`) and in launch()
    out: TensorMeta  # the chain's result
    hoisted: list[str]
    prologue: list[str]
    epilogue: list[str]

    @property
    def nodes(self) -> list[str]:
        c = self.chain
        return ((c.pre.nodes if c.pre else []) + list(c.into) + [c.pool] + ([c.read] if c.read else [])
                + list(c.out_of) + (c.post.nodes if c.post else []))


def build(graph: Graph, chain: PoolChain) -> ChainKernel:
    """The chain's kernel description; Unsupported (with the reason) when the template cannot
    compute it: the pool template refuses the node, the pool's input is not [N, C, spatial...],
    a stage reads its neighbour through a view, a value is not float32 or bf16, or the epilogue
    changes the pooled result's shape or layout."""
    pool = graph.node(chain.pool)
    why = TEMPLATE.supports(graph, pool, {0})
    if why is not None:
        raise Unsupported(f"pool template: {why}")
    if used_outputs(graph, pool) - {0}:
        raise Unsupported("the max pool's indices are read")
    nd = POOLS[pool.target][1]
    x = graph.meta(pool.args[0].name)
    if len(x.shape) != nd + 2:
        raise Unsupported(f"the pool's input {list(x.shape)} is not [N, C, {nd} pooled dims]")
    pooled_value = (chain.out_of or (chain.read or chain.pool,))[-1]  # (what post reads: past a 1-D pool's squeezes)
    pooled = graph.meta(pooled_value)
    out = graph.meta(chain.out)
    for what, meta in (("input", x), ("result", pooled), ("output", out)):
        if meta.dtype not in _DTYPES:
            raise Unsupported(f"the pool's {what} is {meta.dtype} (float32 or bf16 only)")
    if tuple(out.shape) != tuple(pooled.shape):
        raise Unsupported("the epilogue changes the pooled result's shape")
    if not (out.contiguous or out.channels_last):
        raise Unsupported("the chain's result is neither contiguous nor channels-last")
    params: dict[str, str] = {}  # graph value -> kernel pointer name

    def pointer(value: str) -> str:
        return params.setdefault(value, f"a{len(params)}")

    hoisted: list[str] = []
    prologue: list[str] = []
    spatial = ("i_d", "i_h", "i_w")[3 - nd:]
    if chain.pre is not None:
        res = _stage(graph, chain.pre, tuple(graph.meta(chain.pre.outputs[0]).shape),
                     _unviewed(graph, ("img", "c") + spatial, chain.into, up=True), "valid", None, pointer, hoisted,
                     prologue)
        prologue.append(f"v = {_rounded(res, x.dtype)}")
    else:  # the template's own load of the pool's input
        params[pool.args[0].name] = "x"
    epilogue: list[str] = []
    if chain.post is not None:
        acc = "best" if POOLS[pool.target][0] == "max" else "y"
        if pooled.dtype == "bfloat16" and acc == "y":
            epilogue.append("y = kw_round_bf16(y)")
        index = _unviewed(graph, ("img", "c") + tuple(f"o{d[2]}" for d in spatial), chain.out_of, up=False)
        res = _stage(graph, chain.post, tuple(pooled.shape), index, "mask", (pooled_value, acc), pointer, epilogue,
                     epilogue)
        epilogue.append(f"{acc} = {res}")
    return ChainKernel(graph, chain, list(params), list(params.values()), out, hoisted, prologue, epilogue)


def _unviewed(graph: Graph, index: tuple, views: tuple, up: bool) -> tuple:
    """The index variables of the pool's input (or output) `index` for the value past `views`:
    the unsqueezes that made the pool's input (`up`, undone last first) or the squeezes after
    its output drop the variables of their size-1 dims."""
    index = list(index)
    for v in (reversed(views) if up else views):
        node = graph.node(v)
        rank = len(graph.meta(node.args[0].name).shape) + (1 if up else 0)
        dims = node.args[1] if len(node.args) > 1 else []
        dims = [dims] if isinstance(dims, int) else list(dims)
        if not up and not dims:  # (squeeze without dims: every size-1 dim)
            dims = [d for d, n in enumerate(graph.meta(node.args[0].name).shape) if n == 1]
        for d in sorted((d % rank for d in dims), reverse=True):
            if up or graph.meta(node.args[0].name).shape[d] == 1:
                del index[d]
    return tuple(index)


def _stage(graph: Graph, group: Group, shape: tuple, index: tuple, mask: str, own, pointer, hoisted: list[str],
           body: list[str]) -> str:
    """Append the statements of `group` over a tensor of `shape`, its element at the variables
    `index`: loads of operands constant over the spatial dims to `hoisted`, the rest to `body`.
    `own` = (graph value, variable) names a value the kernel already holds (the pooled one).
    Returns the variable holding the group's output."""
    if group.rdims is not None or len(group.outputs) != 1:
        raise Unsupported("a stage of the chain must be a pointwise group of one output")

    def load(var: str, value: str, strides: tuple) -> str | None:
        dtype = graph.meta(value).dtype
        if dtype not in _DTYPES:
            raise Unsupported(f"operand {value} is {dtype} (float32 or bf16 only)")
        terms = [f"{i} * {s}" if s != 1 else i for i, s in zip(index, strides) if s != 0]
        ptr = f"{pointer(value)}_ptr"
        if any(strides[2:]):
            return f"{var} = tl.load({ptr} + {' + '.join(terms)}, mask={mask}, other=0.0).to(tl.float32)"
        # one value per output: before the window loop
        at = " + ".join(terms)
        hoisted.append(f"{var} = {f'tl.load({ptr} + {at}, mask=mask, other=0.0)' if terms else f'tl.load({ptr})'}"
                       ".to(tl.float32)")
        return None

    lines, result, _ = stage_lines(graph, group, shape, None if own is None else (*own, "the pooled values"), load,
                                   "a pool chain")
    body += lines
    return result


def _rounded(var: str, dtype: str) -> str:
    return f"kw_round_bf16({var})" if dtype == "bfloat16" else var


def render(kernel: ChainKernel, config: dict, name: str) -> tuple[str, list[str]]:
    """(module text whose launch(*inputs) returns the chain's result, its inputs) for `config`."""
    graph_meta = [kernel.graph.meta(v) for v in kernel.inputs]
    c = kernel.chain
    args = kernel.names
    expects = [f"{a} = _expect({a}, {tuple(m.shape)!r}, {tuple(m.stride)!r}, {v!r}, torch.{m.dtype})"
               for a, v, m in zip(args, kernel.inputs, graph_meta)]
    stages = " -> ".join(([f"group {c.pre.id}"] if c.pre else []) + [c.pool] + ([f"group {c.post.id}"] if c.post else []))
    chain = dict(
        params=[(a, f"{v}: {m.dtype}{tuple(m.shape)}, strides {tuple(m.stride)}")
                for a, v, m in zip(args, kernel.inputs, graph_meta)],
        hoisted="\n".join(_TOP + line for line in kernel.hoisted),
        prologue="\n".join(_LOOP + line for line in kernel.prologue),
        epilogue="\n".join(_TOP + line for line in kernel.epilogue),
        args=args, ptrs=args, expects=expects, out=kernel.out, inputs=list(kernel.inputs),
        numel=max((m.numel for m in graph_meta), default=0),
        doc=f"Fused: {stages}; reads {', '.join(kernel.inputs)}, writes {c.out}.",
        launch_doc=f"{stages} on {', '.join(kernel.inputs)}: returns ({c.out},).",
    )
    nk: NodeKernel = render_pool(kernel.graph, kernel.graph.node(c.pool), config, {0}, chain)
    return nk.source, nk.inputs
