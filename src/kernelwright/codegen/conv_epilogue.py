"""A convolution with its pointwise epilogue group fused in: a library convolution node whose only
consumer is a pointwise group becomes one implicit-GEMM Triton convolution
(templates/triton/conv.py.j2) whose epilogue is the group's statements (same op table as the
group kernel), so the convolution's output is written once, already transformed, and never read
back.

The epilogue runs on the kernel's accumulator tile of [output pixels, output channels]. Every
operand the group reads besides the convolution's output is passed as a strided view over the
output's logical dims (batch, channel, spatial...): a per-channel operand (a bias) is loaded once
per channel ("col"), a 0-d one once ("scalar"), anything else ("full": a residual, a broadcast
map) through its own strides, 0 where it broadcasts, so no operand is ever copied.

The input's layout copy or bf16 cast that only this convolution reads (plan.rewrites makes them
for channels-last convolutions and the bf16 policy) is absorbed: the kernel reads the source
tensor in its own layout and rounds tiles to bf16 itself, saving that copy's pass over memory.
So is a pointwise group computing the input from one tensor of its shape and per-channel or 0-d
operands (an eval-mode batch norm and activation before the convolution, as in pre-activation
and DenseNet blocks; an input scaling): the kernel applies it to the values it loads (the
template's prologue), so the group's result is never written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.capture.shapes import channels_last_strides, contiguous_strides
from kernelwright.codegen import conv_norm
from kernelwright.codegen.conv_args import CONV
from kernelwright.codegen.epilogue import IDENTITY, Epilogue, EpilogueOperand
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.triton_conv import render_conv
from kernelwright.codegen.triton_gemm import render_depthwise, rows_kernel
from kernelwright.codegen.triton_group import WELFORD_OPS, Stmt, Unsupported, lower, reduce_tile_lines
from kernelwright.codegen.triton_pool import pool_params
from kernelwright.ops import POOLS, layout_clone
from kernelwright.plan.concat import placed_slot
from kernelwright.plan.fusion import Group
from kernelwright.plan.rewrites import plain_cast
from kernelwright.space.config import Config
from kernelwright.space.gemm_space import depthwise_rows_space, depthwise_space
from kernelwright.space.conv_space import BOX_KEYS, CONFIG_KEYS, FLAT_KEYS, ROW_KEYS, SPLIT_KEYS, WARP_KEYS


@dataclass
class ConvEpilogue:
    conv: OpNode
    group: Group | None  # None: the convolution alone
    epilogue: Epilogue
    x: str  # graph value the kernel reads as the input (the source of an absorbed copy)
    w: str
    operands: list[str]  # graph values of the epilogue operands, in order
    views: list[tuple]  # per operand: the (shape, strides) view launch takes of it
    out: str  # the graph value the kernel produces
    out_shape: tuple[int, ...]
    out_dtype: str
    out_channels_last: bool
    cast_bf16: bool  # the input and weight tiles are rounded to bf16 in the kernel
    weight_shape: tuple[int, ...] = ()
    absorbed: tuple[str, ...] = ()  # units (node names / group ids) the kernel computes too
    absorbed_nodes: tuple[str, ...] = ()  # and their graph nodes
    widen_weight: bool = False  # a bf16 weight beside an absorbed float32 input: widened (exactly) first
    pool: str | None = None  # "max" | "avg": the result is pooled over `pool_window` (stride = window)
    pool_window: tuple[int, ...] = ()
    pools: tuple[str, ...] = ()  # the pooling (and getitem) nodes computed too
    post: Group | None = None  # the pointwise group applied after the pooling
    post_epilogue: Epilogue = IDENTITY
    row_out: bool = False  # the last epilogue reduced over the channels: one value per pixel
    whole_n: bool = False  # an epilogue reduces over the channels: one tile must hold them all
    out_meta_shape: tuple[int, ...] = ()  # the shape of `out`
    prologue: Epilogue = IDENTITY  # applied to the input's values as the kernel loads them
    prologue_operands: tuple[str, ...] = ()  # its operands' graph values, in order
    prologue_views: tuple[tuple, ...] = ()  # per operand: the (shape, strides) view launch takes of it
    # per operand value (epilogue and prologue): its (shape, strides) in the graph, which the views
    # above are taken over; launch is handed the value in that layout (host._expect)
    layouts: dict[str, tuple[tuple, tuple]] = field(default_factory=dict)
    into: bool = False  # `out` lies in a concatenation's buffer: launch() takes its slice as out0
    # ((kd, kh, kw), (pd, ph, pw)): `x` is the input of an absorbed max pool (stride 1, the input's
    # shape kept), pooled as the kernel loads it
    in_pool: tuple | None = None
    # the group is a normalization split around its statistics, or a sum over the pixels
    # (codegen/conv_norm.py): the epilogue computes the value it normalizes or sums, the kernels
    # after the convolution the rest
    norm: conv_norm.NormSplit | None = None
    out_meta_stride: tuple[int, ...] = ()  # the strides of `out`
    # a split norm's values of one per row (new running statistics): (shape, strides, dtype) each
    row_metas: dict[str, tuple] = field(default_factory=dict)
    # the dtype the convolution kernel writes a split norm's normalized value in (normalized_dtype)
    norm_dtype: str = ""

    @property
    def args(self) -> dict:
        """The convolution's keyword arguments for the template's launch()."""
        _, _, _, stride, padding, dilation, transposed, output_padding, groups = self.conv.args
        return dict(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=int(groups),
                    **({"output_padding": tuple(output_padding)} if transposed else {}))

    @property
    def transposed(self) -> bool:
        return bool(self.conv.args[6])

    def box_out(self, graph: Graph, precision: str) -> tuple[int, int, int] | None:
        """The output's (D, H, W) per image (1 for missing dims) where the template's
        tensor-descriptor path reads the input (for a transposed convolution, its largest phase
        class's output sub-grid, the output's size over the stride rounded up; with a fused pool,
        the pixels of its whole windows): a convolution with stride 1 or a transposed one, one
        group, tensor-core operands (tf32 / bf16), at least 16 input channels whose rows are 16-byte
        multiples, an input channels-last or NCHW-contiguous (which launch copies channels-last
        first: the template's `tma_box_ok`), and a pool window, if any, of a power-of-two size (a
        box holds whole windows: `box_window`); else None. Transposed convolutions only with
        TRANSPOSED_BOXES (below)."""
        x = graph.meta(self.x)
        a = self.args
        if (self.transposed and not TRANSPOSED_BOXES) or self.in_pool is not None:
            return None
        if (a["groups"] != 1 or (not self.transposed and any(s != 1 for s in a["stride"]))
                or precision not in ("tf32", "bf16") or len(x.shape) < 3 or x.shape[1] < 16):
            return None  # (under 16 channels a tap's K step would be mostly padding: taps fold instead)
        if (x.shape[1] * x.itemsize) % 16 or tuple(x.stride) not in (channels_last_strides(x.shape),
                                                                      contiguous_strides(x.shape)):
            return None
        size = math.prod(self.pool_window) if self.pool else 1
        if size & (size - 1):
            return None
        spatial = tuple(-(-o // s) for o, s in zip(self.conv.meta.shape[2:], a["stride"]))
        if self.pool:
            spatial = tuple(o // k * k for o, k in zip(spatial, self.pool_window))
        return (1,) * (3 - len(spatial)) + spatial

    @property
    def box_window(self) -> tuple[int, int, int]:
        """(D, H, W) sides a box must be a multiple of: the fused pool's window (1s without one)."""
        window = self.pool_window if self.pool else ()
        return (1,) * (3 - len(window)) + tuple(window)

    @property
    def inputs(self) -> list[str]:
        return list(dict.fromkeys([self.x, self.w] + self.operands + list(self.prologue_operands)
                                  + ([] if self.norm is None else self.norm.operands)))

    @property
    def outputs(self) -> list[str]:
        """The graph values launch() returns, in order."""
        return list(self.norm.outputs) if self.norm is not None else [self.out]

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of one group's implicit GEMM: output pixels, output channels per group,
        input channels per group times kernel taps."""
        groups, shape, ws = int(self.conv.args[8]), self.out_shape, self.weight_shape
        cin = ws[0] // groups if self.transposed else ws[1]
        return shape[0] * math.prod(shape[2:]), shape[1] // groups, cin * math.prod(ws[2:])

    @property
    def flops(self) -> int:
        M, N, K = self.gemm
        return 2 * M * N * K * int(self.conv.args[8])


# Whether the search offers box configs for transposed convolutions (each phase class reads its
# taps' inputs as descriptor boxes): checked against cuDNN on the H100 and 1.3-1.7x faster than the
# gather configs of the same tiles on stride-2 ConvTranspose2d / 3d shapes (docs/benchmarks.md,
# "The convolution template's first configs").
TRANSPOSED_BOXES = True


def conv_supported(graph: Graph, conv: OpNode) -> str | None:
    """None when the convolution template computes `conv` (1-3 spatial dims, dense, grouped or
    transposed, float32 or bf16 operands of one dtype, numeric padding), else why not."""
    if conv.target != CONV:
        return "not a convolution"
    x, w, b = conv.args[:3]
    if not (isinstance(x, Ref) and isinstance(w, Ref)) or (b is not None and not isinstance(b, Ref)):
        return "operands are not tensor values"
    xm, wm = graph.meta(x.name), graph.meta(w.name)
    if xm is None or wm is None or conv.meta is None or not 3 <= len(xm.shape) <= 5:
        return "only 1-, 2- and 3-D convolutions"
    if xm.dtype not in ("float32", "bfloat16") or wm.dtype != xm.dtype:
        return "float32 or bf16 operands of one dtype only"
    if any(not isinstance(p, int) for p in conv.args[4]):
        return "padding is not numeric"
    return None


def _absorbable_input(graph: Graph, conv: OpNode, groups: list[Group]) -> tuple[str, tuple[str, ...], tuple, bool] | None:
    """(source value, units, nodes, rounds to bf16) when the conv's input is a layout copy or a
    bf16 cast of another value that this convolution alone reads: a clone / _to_copy node (its
    own unit) or a group that is nothing but the cast; else None."""
    x = conv.args[0].name
    if graph.is_input(x) or x in graph.outputs or x in graph.mutations \
            or [u.name for u in graph.users(x)] != [conv.name]:
        return None
    node = graph.node(x)
    if not node.args or not isinstance(node.args[0], Ref):
        return None
    src = node.args[0].name
    if any(x in g.nodes and g.nodes != [x] for g in groups):
        return None  # a copy the group computing its input writes (the group is the prologue)
    if layout_clone(node):
        return src, (x,), (x,), False
    if node.target == "aten._to_copy.default" and set(node.kwargs) <= {"dtype", "memory_format"} \
            and node.meta.dtype == "bfloat16" and graph.meta(src).dtype == "float32":
        group = next((g for g in groups if g.nodes == [x] and g.outputs == [x]), None)
        if "memory_format" in node.kwargs or (group is not None and plain_cast(graph, node)):
            return src, ((group.id,) if group is not None else (x,)), (x,), True
    return None


def _pooled_input(graph: Graph, x: str, reader: str):
    """(the pool's input, units, nodes, ((kd, kh, kw), (pd, ph, pw))) when value `x` (the
    convolution's input, or the source of its absorbed layout copy, node `reader`) is the values of
    a max pool that `reader` alone reads, whose indices nothing reads, at stride 1 and dilation 1
    with odd windows padded by half (its result has its input's shape: an Inception module's pool
    branch); else None. The template max-pools the input as it loads it (`in_pool`)."""
    if graph.is_input(x) or x in graph.outputs or x in graph.mutations \
            or [u.name for u in graph.users(x)] != [reader]:
        return None
    item = graph.node(x)
    if item.target != "getitem" or item.args[1] != 0 or not isinstance(item.args[0], Ref):
        return None
    pool = graph.node(item.args[0].name)
    if POOLS.get(pool.target, ("avg",))[0] != "max" or "with_indices" not in pool.target \
            or [u.name for u in graph.users(pool.name)] != [x] or not isinstance(pool.args[0], Ref):
        return None
    params = pool_params(pool)
    nd, kernel, padding = params["nd"], params["kernel"], params["padding"]
    if nd not in (2, 3) or any(s != 1 for s in params["stride"]) or any(d != 1 for d in params["dilation"]) \
            or any(k % 2 == 0 or p != (k - 1) // 2 for k, p in zip(kernel, padding)):
        return None
    src = pool.args[0].name
    if graph.meta(src).dtype not in ("float32", "bfloat16") or graph.meta(src).dtype != graph.meta(x).dtype:
        return None
    pad3 = lambda v, fill: tuple([fill] * (3 - nd) + list(v))  # noqa: E731
    return src, (pool.name, x), (pool.name, x), (pad3(kernel, 1), pad3(padding, 0))


def _prologue_input(graph: Graph, x: str, reader: str, groups: list[Group]):
    """(source value, units, nodes, rounds to bf16, prologue, its operands' values and views) when
    value `x` (the convolution's input, or the source of its absorbed layout copy or cast, node
    `reader`) is computed by a pointwise group that `reader` alone reads, from one tensor of x's
    shape (read in place) and per-channel or 0-d operands; else None. The group's statements
    become the template's prologue (`acc`: the loaded input values)."""
    if graph.is_input(x) or x in graph.outputs or x in graph.mutations \
            or [u.name for u in graph.users(x)] != [reader]:
        return None
    group = next((g for g in groups if g.outputs == [x] and x in g.nodes), None)
    if group is None or group.rdims is not None:
        return None
    shape = tuple(graph.meta(x).shape)
    full = [v for v in group.inputs if graph.meta(v) is not None and tuple(graph.meta(v).shape) == shape]
    if len(full) != 1 or graph.meta(full[0]).dtype not in ("float32", "bfloat16"):
        return None
    source = full[0]
    ops: list[EpilogueOperand] = []
    values: list[str] = []
    views: list[tuple] = []

    def load(var: str, value: str, strides: tuple) -> str:
        nonzero = [i for i, st in enumerate(strides) if st != 0]
        if nonzero not in ([], [1]):
            raise Unsupported("a prologue operand that varies over the pixels or the batch")
        name = f"p{len(ops)}"
        ops.append(EpilogueOperand(name, "col" if nonzero else "scalar"))
        values.append(value)
        views.append(((shape[1],), (strides[1],)) if nonzero else ((), ()))
        return f"{var} = {name}"

    try:
        lines, result, _ = stage_lines(graph, group, shape, (source, "acc", "the convolution's input source"),
                                       load, "a convolution prologue")
    except Unsupported:
        return None
    cast = graph.meta(x).dtype == "bfloat16" and graph.meta(source).dtype == "float32"
    if graph.meta(x).dtype != graph.meta(source).dtype and not cast:
        return None
    prologue = Epilogue(tuple(ops), "\n".join(lines + [f"acc = {result}"]))
    return source, (group.id,), tuple(group.nodes), cast, prologue, tuple(values), tuple(views)


def output_view(strides: tuple, domain: tuple, shape: tuple) -> tuple[int, ...]:
    """Strides over the convolution output's dims `shape` of an operand read with `strides` over
    the group's `domain` (a coarsening of `shape`: each domain dim merges consecutive output
    dims); Unsupported for any other domain."""
    out, j = [], len(shape)
    for size, st in zip(reversed(domain), reversed(strides)):
        dims = []
        while j > 0 and (not dims or math.prod(dims) < size):
            j -= 1
            dims.insert(0, shape[j])
        if math.prod(dims) != size:
            raise Unsupported(f"the group's domain {list(domain)} is not the convolution's {list(shape)}")
        inner = []
        for d in reversed(dims):
            inner.insert(0, st)
            st *= d
        out = inner + out
    if j != 0 or len(out) != len(shape):
        raise Unsupported(f"the group's domain {list(domain)} is not the convolution's {list(shape)}")
    return tuple(0 if shape[i] == 1 else s for i, s in enumerate(out))


def fusable(graph: Graph, conv: OpNode, group: Group | None, pools: tuple[str, ...] = (),
            post: Group | None = None) -> str | None:
    """None when `conv`'s output feeds only `group` (or, with no group, the first of `pools`) and the
    chain can be its epilogue: the group pointwise or reducing over the channels alone, pooling
    windows as large as their strides, the post group pointwise (or reducing over the channels);
    one output of the expected shape. Else the reason."""
    why = conv_supported(graph, conv)
    if why:
        return why
    if conv.name in graph.outputs or conv.name in graph.mutations:
        return "the convolution's output itself is a model output"
    if group is None and not pools:
        return "nothing to fuse"
    split = None
    if group is not None:
        split = conv_norm.match(graph, conv, group) if group.rdims is not None and not pools else None
        why = None if isinstance(split, conv_norm.NormSplit) else \
            _stage_fusable(graph, group, conv.name, tuple(conv.meta.shape), conv)
        if why:
            return why if split is None else f"{why}; as a split norm: {split}"
    elif any(u.name != pools[0] for u in graph.users(conv.name)):
        return "the convolution's output has consumers besides its pool"
    last = conv.name if group is None else split.out if isinstance(split, conv_norm.NormSplit) else group.outputs[0]
    if pools:
        if bool(conv.args[6]):
            return "pooling is fused into convolutions only (a transposed one's programs own one stride phase class)"
        last = pools[-1]
        if post is not None:
            why = _stage_fusable(graph, post, last, tuple(graph.meta(last).shape), conv)
            if why:
                return why
            last = post.outputs[0]
    out = graph.meta(last)
    if out.dtype not in ("float32", "bfloat16"):
        return "float32 or bf16 outputs only"
    slot = placed_slot(graph, last)
    if slot is not None:  # a slice of a concatenation's buffer (plan.concat): written there, any strides
        out = graph.meta(slot.buffer)
    if not (out.contiguous or out.channels_last):
        return "the fused result is neither contiguous nor channels-last" + (" (nor a slice of such a buffer)" if slot else "")
    return None


def _stage_fusable(graph: Graph, group: Group, value: str, shape: tuple, conv: OpNode) -> str | None:
    """Why `group` cannot be an epilogue stage applied to `value` (of `shape`, computed from `conv`), or None."""
    if group.rdims is not None and (tuple(group.domain) != shape or tuple(group.rdims) != (1,)):
        return "the group reduces over more than the channels (norm and spatial-reduction epilogues are separate kernels)"
    if group.rdims is not None and int(conv.args[8]) != 1:
        return "a reduction over the channels of a grouped convolution (a tile holds one group's channels)"
    members = set(group.nodes)
    if any(u.name not in members for u in graph.users(value)):
        return "the convolution's output has consumers outside the group"
    if len(group.outputs) != 1:
        return "the group must produce one value"
    out = graph.meta(group.outputs[0])
    if group.rdims is None and tuple(out.shape) != shape:
        return "the group's output does not have the convolution's shape"
    return None


def build(graph: Graph, conv: OpNode, group: Group | None, groups: list[Group] = (), pools: tuple[str, ...] = (),
          post: Group | None = None, prologue_groups: list[Group] | None = None) -> ConvEpilogue:
    """The epilogue (operands, statements) that applies `group` to `conv`'s accumulator; with the
    plan's `groups`, the input's layout copy or bf16 cast is absorbed, and a pointwise group of
    `prologue_groups` (default: `groups`) computing the input becomes the prologue of the kernel's
    loads (module docstring). With
    `group` None and no pools: the convolution alone (its bias, if it has one, as the epilogue).
    With `pools` (a plan.Pair's pooling and getitem nodes) the result is pooled in the kernel and
    `post` applied to the pooled tile."""
    why = fusable(graph, conv, group, pools, post) if (group is not None or pools) else conv_supported(graph, conv)
    if why:
        raise Unsupported(why)
    shape = tuple(conv.meta.shape)
    ops: list[EpilogueOperand] = []
    values: list[str] = []
    views: list[tuple] = []

    def operand(value: str, strides: tuple, over: tuple) -> str:
        nonzero = [i for i, s in enumerate(strides) if s != 0]
        if not nonzero:
            kind, view = "scalar", ((), ())
        elif nonzero == [1]:
            kind, view = "col", ((over[1],), (strides[1],))
        else:
            kind, view = "full", (over, strides)
        name = f"e{len(ops)}"
        ops.append(EpilogueOperand(name, kind))
        values.append(value)
        views.append(view)
        return name

    code: list[str] = []
    b = conv.args[2]
    if isinstance(b, Ref):
        code.append(f"acc = acc + {operand(b.name, tuple(1 if i == 1 else 0 for i in range(len(shape))), shape)}")
    out, meta, row_out, whole_n = conv.name, conv.meta, False, False
    norm = conv_norm.match(graph, conv, group) if group is not None and group.rdims is not None and not pools else None
    if isinstance(norm, conv_norm.NormSplit):
        code += _norm_prefix(graph, conv, norm, shape, operand)
        out = norm.out
        meta = graph.meta(out)
    elif group is not None:
        norm = None
        row_out = _stage(graph, group, conv.name, shape, code, operand)
        whole_n = group.rdims is not None
        out = group.outputs[0]
        meta = graph.meta(out)
    pool, window, post_code, pre_n = None, (), [], len(ops)
    if pools:
        if row_out:
            raise Unsupported("pooling a value reduced over the channels")
        pool, window = _pool_window([graph.node(n) for n in pools if graph.node(n).target != "getitem"], shape)
        out = pools[-1]
        meta = graph.meta(out)
        if post is not None:
            row_out = _stage(graph, post, out, tuple(meta.shape), post_code, operand)
            whole_n = whole_n or post.rdims is not None
            out = post.outputs[0]
            meta = graph.meta(out)
    x, absorbed, absorbed_nodes, cast = conv.args[0].name, (), (), False
    prologue, pro_values, pro_views = IDENTITY, (), ()
    found = _absorbable_input(graph, conv, list(groups))
    if found is not None:
        x, absorbed, absorbed_nodes, cast = found
    in_pool = None
    pooled = None if cast or conv.args[6] else _pooled_input(graph, x, absorbed_nodes[0] if absorbed_nodes else conv.name)
    if pooled is not None:
        x, units, nodes, in_pool = pooled
        absorbed, absorbed_nodes = units + absorbed, nodes + absorbed_nodes
    pro = None if in_pool is not None else _prologue_input(graph, x, absorbed_nodes[0] if absorbed_nodes else conv.name,
                                                            list(groups if prologue_groups is None else prologue_groups))
    if pro is not None and not (cast and pro[3]):
        x, units, nodes, pro_cast, prologue, pro_values, pro_views = pro
        absorbed, absorbed_nodes, cast = units + absorbed, nodes + absorbed_nodes, cast or pro_cast
    w = conv.args[1].name
    widen = cast and graph.meta(w).dtype == "bfloat16"
    pre = Epilogue(tuple(ops[:pre_n]), "\n".join(code)) if code or ops[:pre_n] else IDENTITY
    norm_values = [] if norm is None else norm.operands
    layouts = {v: (tuple(graph.meta(v).shape), tuple(graph.meta(v).stride))
               for v in [*values, *pro_values, *norm_values]}
    into = placed_slot(graph, out) is not None and not row_out
    channels_last = meta.channels_last or (into and len(meta.shape) in (4, 5) and meta.stride[1] == 1)
    return ConvEpilogue(conv, group, pre, x, w, values, views, out, shape, meta.dtype, channels_last, cast,
                        tuple(graph.meta(w).shape), absorbed, absorbed_nodes, widen, pool, window, tuple(pools), post,
                        Epilogue(tuple(ops[pre_n:]), "\n".join(post_code)), row_out, whole_n, tuple(meta.shape),
                        prologue, pro_values, pro_views, layouts, into, in_pool, norm, tuple(meta.stride),
                        {} if norm is None else {v: (tuple(graph.meta(v).shape), tuple(graph.meta(v).stride),
                                                     graph.meta(v).dtype) for v in norm.outputs if v != out},
                        "" if norm is None else normalized_dtype(graph, conv, group, norm))


def normalized_dtype(graph: Graph, conv: OpNode, group: Group, norm: conv_norm.NormSplit) -> str:
    """The dtype of the buffer holding the value a split norm normalizes (the convolution kernel
    writes it, the apply pass reads it): the graph's dtype of that value, or the convolution's
    where the value is the convolution's output through plain casts alone (a bf16 convolution's
    result widened: bf16 holds it exactly, in half the bytes), as for a statistics-only split,
    whose kernel writes the convolution's own output."""
    if norm.stats_only:
        return conv.meta.dtype
    if norm.sums:  # (the summed value the group returns, or a float32 value the apply reads or no one stores)
        return graph.meta(norm.out).dtype if norm.direct else "float32"
    stats = [graph.node(n) for n in group.nodes if graph.node(n).target in WELFORD_OPS]
    if len(stats) != 1 or not stats[0].args or not isinstance(stats[0].args[0], Ref):
        return "float32"
    value = src = stats[0].args[0].name
    while src != conv.name and not graph.is_input(src) and plain_cast(graph, graph.node(src)):
        src = graph.node(src).args[0].name
    return conv.meta.dtype if src == conv.name else graph.meta(value).dtype


def _norm_prefix(graph: Graph, conv: OpNode, norm: conv_norm.NormSplit, shape: tuple, operand) -> list[str]:
    """The statements computing the value a split norm normalizes (conv_norm.match) on the
    accumulator, its operands through `operand(value, strides over the output, shape)`."""
    domain, C = norm.domain, shape[1]

    def over_output(strides: tuple) -> tuple:
        if norm.channel_split:  # [N, G, C / G, ...] -> [N, C, ...]
            s_g, s_k = strides[1], strides[2]
            if s_g == s_k * domain[2]:
                s_c = s_k
            elif s_g == 0 and s_k == 0:
                s_c = 0
            else:
                raise Unsupported("an operand that varies along the channel groups unlike along the channels")
            strides, dims = (strides[0], s_c, *strides[3:]), (domain[0], C, *domain[3:])
        else:
            dims = domain
        # (size-1 dims dropped: a group norm of one channel per group has a [N, C, 1, spatial] domain)
        kept = [(n, st) for n, st in zip(dims, strides) if n != 1] or [(1, 0)]
        return output_view(tuple(st for _, st in kept), tuple(n for n, _ in kept), shape)

    own = over_output(norm.own.operand.strides)
    if own != output_view(tuple(conv.meta.stride), shape, shape):
        raise Unsupported("the group reads the convolution's output through a view")
    if norm.stats_only:  # (a statistics group's kernel writes the convolution's output itself: no epilogue)
        return []
    lines = []
    for st in norm.pre:
        if st is norm.own:
            lines.append(f"{st.var} = acc")
        elif st.kind == "load":
            lines.append(f"{st.var} = {operand(st.operand.value, over_output(st.operand.strides), shape)}")
        else:
            lines.append(f"{st.var} = {st.code}")
    return lines + [f"acc = {norm.t}"]


def _stage(graph: Graph, group: Group, value: str, shape: tuple, code: list[str], operand) -> bool:
    """Append to `code` the statements applying `group` to the accumulator, which holds `value`
    (of `shape`); operands through `operand(value, strides, shape)`. A reduction over the channels
    (`_stage_fusable`) runs across the tile's columns. Returns whether the result is one value per
    pixel (the group's output is reduced over the channels)."""
    lines, result, store = stage_lines(
        graph, group, shape, (value, "acc", "the convolution's output"),
        lambda var, v, strides: f"{var} = {operand(v, strides, shape)}", "a convolution epilogue",
        reduce=lambda st: reduce_tile_lines(st, shape[1], mask="mask", axis=1, index="offs_n[None, :]"))
    code += lines + [f"acc = {result}"]
    return group.rdims is not None and store.level == "row"


def stage_lines(graph: Graph, group: Group, shape: tuple, own: tuple[str, str, str] | None, load, where: str,
                reduce=None) -> tuple[list[str], str, Stmt]:
    """The Triton statements of `group` (lowered) over a tensor of `shape` (the group's domain a
    coarsening of it: `output_view`), for a kernel that holds one value already: a load of
    own = (graph value, its variable, what it is called) reads the variable (Unsupported through
    a view); every other load is `load(var, graph value, strides over shape)`, its line or None
    when the caller placed it itself; a reduction is `reduce(stmt)`'s lines (Unsupported without
    one). Returns (the lines, the variable the group stores, the store statement)."""
    own_strides = None if own is None else output_view(tuple(graph.meta(own[0]).stride), shape, shape)
    lines: list[str] = []
    store = None
    for st in lower(graph, group).stmts:
        if st.kind == "load":
            o = st.operand
            strides = output_view(tuple(o.strides), tuple(group.domain), shape)
            if own is not None and o.value == own[0]:
                if strides != own_strides:
                    raise Unsupported(f"the group reads {own[2]} through a view")
                lines.append(f"{st.var} = {own[1]}")
            elif (line := load(st.var, o.value, strides)) is not None:
                lines.append(line)
        elif st.kind == "expr":
            lines.append(f"{st.var} = {st.code}")
        elif st.kind == "reduce" and reduce is not None:
            lines += reduce(st)
        elif st.kind == "store":
            store = st
        else:
            raise Unsupported(f"statement {st.kind} {st.op} in {where}")
    if store is None:
        raise Unsupported("the group stores nothing")
    return lines, store.deps[0], store


def _pool_window(pools: list[OpNode], shape: tuple) -> tuple[str, tuple[int, ...]]:
    """(kind, window) of pooling `pools` one after the other over a convolution output of `shape`,
    as one pool: each window as large as its stride, unpadded, undilated, floor mode, so a chain of
    them is one window (the product; floor(floor(o / a) / b) = floor(o / (a * b))). Unsupported
    otherwise, and for windows of more than 64 pixels (a tile holds whole windows, each padded to a
    power of two)."""
    nd = len(shape) - 2
    window = [1] * nd
    kind = None
    for node in pools:
        p = pool_params(node)
        if p["nd"] != nd or p["stride"] != p["kernel"] or any(p["padding"]) or any(d != 1 for d in p["dilation"]) \
                or p["ceil_mode"] or p["divisor_override"] is not None:
            raise Unsupported("only pools whose window equals their stride, unpadded, in floor mode")
        kind = p["kind"]
        window = [a * k for a, k in zip(window, p["kernel"])]
    if math.prod(window) > 64:
        raise Unsupported(f"pooling window {window}: at most 64 pixels")
    return kind, tuple(window)


# the configs of the direct depthwise kernel (templates/triton/depthwise_conv2d.py.j2) with the group as
# its epilogue, searched beside the implicit-GEMM template's for a depthwise convolution
DIRECT = "triton.conv_dw"


def direct_depthwise(fused: ConvEpilogue) -> str | None:
    """None when the direct depthwise kernel computes `fused`: a 2-D depthwise convolution (groups
    == input channels, weight [C * mult, 1, KH, KW]) with a pointwise epilogue group, its input read
    as it lies (any strides) or rounded to bf16 as it is loaded (an absorbed cast), its result
    stored NCHW, channels-last or into a concatenation's slice; a normalization or a sum over the
    pixels split around its statistics (conv_norm) as well, each program keeping its partial
    statistics per channel; an input prologue (the previous layer's batch norm and activation)
    applied to the values it loads. Its taps are float32 multiply-adds: a depthwise convolution
    has one input channel per output channel, which leaves the implicit-GEMM template a GEMM of one
    column per group. Pools and channel reductions stay the implicit-GEMM template's. Else why not."""
    if fused.transposed or len(fused.out_shape) != 4:
        return "a 2-D convolution only"
    if fused.weight_shape[1] != 1:  # (one input channel per group: groups == input channels)
        return "not a depthwise convolution (groups == input channels, weight [C*mult, 1, KH, KW])"
    if fused.pool or fused.post is not None or fused.in_pool is not None or fused.row_out or fused.whole_n:
        return "pools and channel reductions are the implicit-GEMM template's"
    if fused.group is None:
        return "no epilogue group (the depthwise node template computes the convolution alone)"
    return None


def direct_space(fused: ConvEpilogue, channels_last: bool) -> list[Config]:
    """The direct kernel's configs: its pixel tiles, then (kernels of 2-7 rows and 1-7 columns at
    row stride and dilation 1) its row-streaming kernel's. The first: over an NCHW input, the
    depthwise node template's default (256 pixels, whose rows are contiguous, by 4 channels); over
    a channels-last input, whose contiguous axis is the channels, 64 pixels by up to 32 channels,
    and tiles of 16 or more channels before the rest."""
    C, OW = fused.out_shape[1], fused.out_shape[-1]
    tiles = depthwise_space(C=C, OW=OW)
    if channels_last:
        tiles.sort(key=lambda c: -(c["BLOCK_N"] >= min(16, C)))  # (stable: the space's order within)
        first = Config.make(DIRECT, BLOCK_M=64, BLOCK_N=min(32, 1 << (C - 1).bit_length()), num_warps=4)
    else:
        first = Config.make(DIRECT, BLOCK_M=256, BLOCK_N=4, num_warps=4)
    out = [first] + [Config.make(DIRECT, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_W=c["BLOCK_W"],
                                 num_warps=c["num_warps"]) for c in tiles]
    rows = rows_kernel(fused.weight_shape[2:], fused.args["stride"], fused.args["dilation"])
    if rows is not None:
        out += [Config.make(DIRECT, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], ROWS=c["ROWS"], num_warps=c["num_warps"])
                for c in depthwise_rows_space(C=C, OW=OW, KH=rows[0])]
    return out


def direct_seeds(configs: list[Config]) -> list[Config]:
    """The two of the direct kernel's configs (`direct_space`) a search times first: its first, and
    its row-streaming kernel's first where it has one, else its second. They go before the
    implicit GEMM's seeds, whose tiles have one column per group on a depthwise convolution: 16-40x
    the direct kernel's time on KernelBench level-3 21 at `f3f7e25` (docs/benchmarks.md, "The
    direct depthwise kernel, sum units and persistent convolution programs timed")."""
    rows = [c for c in configs if c.as_dict().get("ROWS")][:1]
    return configs[:1] + (rows or configs[1:2])


def render(fused: ConvEpilogue, config: dict, precision: str, name: str) -> tuple[str, list[str]]:
    """Module text whose `launch(*inputs)` runs the fused convolution with the implicit-GEMM
    template's `config`; its inputs."""
    text = render_conv(fused.epilogue, name=name, transposed=fused.transposed, pool=fused.pool,
                       post=fused.post_epilogue, row_out=fused.row_out, whole_n=fused.whole_n, prologue=fused.prologue,
                       in_pool=fused.in_pool, stats=fused.norm is not None)
    ins = fused.inputs
    arg = {v: f"a{i}" for i, v in enumerate(ins)}
    kw = {k: config[k] for k in CONFIG_KEYS + BOX_KEYS + ROW_KEYS + SPLIT_KEYS + WARP_KEYS + FLAT_KEYS if config.get(k)}
    if fused.cast_bf16:
        kw["CAST_BF16"] = True
    elif precision == "tf32":
        kw["INPUT_PRECISION"] = "tf32"  # (float32 operands only: the template ignores it for bf16)
    views, prologue, out, absorbed = _launch_parts(fused, arg)
    weight = f"{arg[fused.w]}.float()" if fused.widen_weight else arg[fused.w]
    call = ", ".join([arg[fused.x], weight] + views
                     + [f"{k}={v!r}" for k, v in fused.args.items()]
                     + ([f"pool_window={fused.pool_window!r}"] if fused.pool else [])
                     + prologue + out + [f"{k}={v!r}" for k, v in kw.items()])
    out_shape = tuple(fused.out_meta_shape)
    reshape = f".view({list(out_shape)})" if fused.row_out and len(out_shape) == len(fused.out_shape) - 1 else ""
    what = "transposed convolution" if fused.transposed else "convolution"
    epi = f" with group {fused.group.id} fused as its epilogue" if fused.group is not None else ""
    if fused.pool:
        epi += f", {fused.pool}-pooled over {list(fused.pool_window)}" + (
            f", then group {fused.post.id}" if fused.post is not None else "")
    expects = _expects(fused, arg)
    if fused.norm is not None:
        return with_helpers(text + _norm_wrapper(fused, name, arg, call, expects, absorbed)), ins
    return with_helpers(text + _wrapper(fused, arg, call, f"{what} {list(fused.out_shape)}{epi}{absorbed}", reshape)), ins


def _launch_parts(fused: ConvEpilogue, arg: dict) -> tuple[list[str], list[str], list[str], str]:
    """What both templates' launch() calls take alike: the epilogue operands' views, the input
    prologue's (as `prologue_operands=`), the output's keywords, and the docstring's note on the
    units the kernel absorbs."""
    views = [f"{arg[v]}.as_strided({list(shape)}, {list(strides)})"
             for v, (shape, strides) in zip(fused.operands, fused.views)]
    prologue = [f"{arg[v]}.as_strided({list(shape)}, {list(strides)})"
                for v, (shape, strides) in zip(fused.prologue_operands, fused.prologue_views)]
    norm = fused.norm
    out = ([f"out_dtype=torch.{fused.norm_dtype if norm is not None else fused.out_dtype}",
            f"out_channels_last={fused.out_channels_last}"]
           + (["out=out0"] if fused.into else []) + (["write_y=False"] if norm is not None and not norm.writes else []))
    absorbed = "" if not fused.absorbed else (
        f"; reads {fused.x} itself ({', '.join(fused.absorbed)} absorbed"
        + (f"; {fused.absorbed[0]} as the prologue of its loads)" if prologue else ")"))
    return views, [f"prologue_operands=({''.join(p + ', ' for p in prologue)})"] if prologue else [], out, absorbed


def _expects(fused: ConvEpilogue, arg: dict) -> str:
    """launch()'s lines handing each operand over in its graph layout: an operand the views
    reinterpret may arrive in another (a library op may return one: an upsample of a channels-last
    tensor is channels-last on the device, contiguous in the graph's metadata), copied into it
    where it differs."""
    return "".join(f"    {arg[v]} = _expect({arg[v]}, {shape!r}, {stride!r}, {v!r})\n"
                   for v, (shape, stride) in fused.layouts.items())


def _wrapper(fused: ConvEpilogue, arg: dict, call: str, what: str, reshape: str = "") -> str:
    """The module's launch(*inputs): the template's launch called as `call`."""
    into = "; out0= writes it into that tensor (a concatenation's slice)" if fused.into else ""
    return f'''

_conv_launch = launch


def launch({", ".join([arg[v] for v in fused.inputs] + (["out0=None"] if fused.into else []))}):
    """{fused.conv.name}: {what}: {list(fused.out_meta_shape)}.

    Inputs: {", ".join(fused.inputs)}. Returns ({fused.out},){into}."""
{_expects(fused, arg)}    return (_conv_launch({call}){reshape},)
'''


def render_direct(fused: ConvEpilogue, config: dict, name: str) -> tuple[str, list[str]]:
    """Module text whose `launch(*inputs)` runs the direct depthwise kernel (`direct_depthwise`)
    with the group as its epilogue and a `DIRECT` config; its inputs."""
    why = direct_depthwise(fused)
    if why:
        raise Unsupported(why)
    a = fused.args
    norm = fused.norm
    text = render_depthwise(fused.epilogue, name=name, stats=norm is not None, prologue=fused.prologue,
                            rows_kernel=rows_kernel(fused.weight_shape[2:], a["stride"], a["dilation"]))
    ins = fused.inputs
    arg = {v: f"a{i}" for i, v in enumerate(ins)}
    views, prologue, out, absorbed = _launch_parts(fused, arg)
    tile = {k: int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_W", "ROWS", "num_warps") if config.get(k)}
    call = ", ".join([arg[fused.x], arg[fused.w]] + views
                     + [f"{k}={a[k]!r}" for k in ("stride", "padding", "dilation")]
                     + prologue + out + [f"ROUND_X={fused.cast_bf16}"] + [f"{k}={v!r}" for k, v in tile.items()])
    if norm is not None:
        return with_helpers(text + _norm_wrapper(fused, name, arg, call, _expects(fused, arg),
                                                 absorbed + "; the convolution as a direct depthwise kernel")), ins
    what = (f"depthwise convolution {list(fused.out_shape)} as a direct kernel, group {fused.group.id} "
            f"fused as its epilogue{absorbed}")
    return with_helpers(text + _wrapper(fused, arg, call, what)), ins


def _norm_wrapper(fused: ConvEpilogue, name: str, arg: dict, call: str, expects: str, absorbed: str) -> str:
    """launch() of a convolution whose normalization group is split around its statistics: the
    convolution with the group's statements before them as its epilogue (writing the normalized
    value t and its partial statistics), the rows' statistics from the partials (and the group's
    values of one per row), the statements after them on t (codegen/conv_norm.py)."""
    norm, out = fused.norm, fused.out
    meta_shape, N = tuple(fused.out_meta_shape), fused.out_shape[0]
    shift = f"{arg[norm.shift.operand.value]}, " if norm.shift is not None else ""
    rows = norm.groups if norm.over_batch else N * norm.groups
    numel = math.prod(meta_shape)
    row_args = []  # the statistics kernel's operands and outputs of one per row, in its order
    for st in conv_norm.row_statements(norm):
        if st.kind == "load":
            row_args.append(arg[st.operand.value])
        elif st.kind == "store":
            row_args.append(f"out_{st.operand.value}")
    allocs = "".join(f"    out_{v} = _alloc({shape!r}, torch.{dtype}, t.device, {stride!r})\n"
                     for v, (shape, stride, dtype) in fused.row_metas.items())
    results = ", ".join("out" if v == out else f"out_{v}" for v in norm.outputs)
    rows_doc = (f"{rows} rows' statistics (a channel over all {N} images" if norm.over_batch else
                f"{rows} rows' statistics ({norm.groups} per image of {norm.per_row} channel(s)")
    if norm.stats_only:
        what = (f"convolution {list(fused.out_shape)}{absorbed}, keeping each tile's partial statistics; then "
                f"group {fused.group.id}'s\n    {rows_doc}, {norm.count} values each) and its values of one per row")
        apply = "    out = t\n"
    elif norm.sums and (norm.direct or not norm.writes):
        what = (f"convolution {list(fused.out_shape)} with group {fused.group.id}'s statements before its sum as "
                f"the epilogue, writing\n    {'that value and' if norm.writes else 'nothing but'} each tile's partial "
                f"statistics; then the {rows_doc.replace('statistics', 'sums')}, {norm.count} values each) and the "
                f"values of one per row after them{absorbed}")
        apply = "    out = t\n" if norm.writes else ""
    else:
        what = (f"convolution {list(fused.out_shape)} with group {fused.group.id}'s statements before its\n    statistics "
                f"as the epilogue, which also keeps each tile's partial statistics; then the\n    {rows_doc}, "
                f"{norm.count} values each) and the statements after them in one pass{absorbed}")
        apply = (f"    out = _alloc({meta_shape!r}, torch.{fused.out_dtype}, t.device, {tuple(fused.out_meta_stride)!r})\n"
                 f"    {name}_apply[(_cdiv({numel}, 1024),)](t, row_mean, row_m2, "
                 f"{''.join(arg[s.operand.value] + ', ' for s in conv_norm.apply_loads(norm))}out, BLOCK=1024)\n")
    return f'''
{conv_norm.kernels(norm, name)}

_conv_launch = launch


def launch({", ".join(arg[v] for v in fused.inputs)}):
    """{fused.conv.name}: {what}.

    Inputs: {", ".join(fused.inputs)}. Returns ({", ".join(norm.outputs)},)."""
{expects}    t, cnt, mean, m2 = _conv_launch({call})
    row_mean = torch.empty({rows}, device=t.device, dtype=torch.float32)
    row_m2 = torch.empty_like(row_mean){"  # (each row's sum)" if norm.sums else ""}
{allocs}    {name}_stats[({rows},)](cnt, mean, m2, {shift}row_mean, row_m2, {"".join(a + ", " for a in row_args)}cnt.shape[1], cnt.shape[2], {N},
                GROUPS={norm.groups}, PER_ROW={norm.per_row},
                BLOCK=min(1024, triton.next_power_of_2(cnt.shape[1] * {norm.per_row}{f" * {N}" if norm.over_batch else ""})))
{apply}    return ({results},)
'''
