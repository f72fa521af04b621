"""Triton max/avg pooling for single ATen nodes, rendered from templates/triton/pool.py.j2.

Handles ``max_pool{1,2,3}d_with_indices`` and ``avg_pool{1,2,3}d`` on contiguous (NC(D)HW) floating
inputs. (nn.MaxPool1d/AvgPool1d and F.max_pool1d/avg_pool1d are captured as unsqueeze -> *_pool2d ->
squeeze, so the 2-D ops cover them; the 1-D ATen ops are accepted too.) Every pool is viewed as a
3-D pool over (D, H, W) with size-1 leading pooled dims, so one kernel text serves all ranks; the
sizes of the unused dims are constexpr 1 and fold away.

One program computes BLOCK consecutive outputs of the flattened output (N*C*OD*OH*OW); the window
is unrolled with ``tl.static_range``, padding is handled with masks (-inf for max, 0 for avg).
Output shapes come from the captured node, so ``ceil_mode`` needs nothing extra. Max pools write
the int64 indices only when output 1 is read (`used`), otherwise the kernel keeps just a running
maximum. Indices follow PyTorch exactly: flat index into the input's pooled plane, the first
occurrence of the maximum, a NaN always takes over (the last NaN wins), and a window whose
elements are all -inf reports its first in-bounds element. Avg pools divide like PyTorch:
``divisor_override`` if given, else the window clipped to the padded input (count_include_pad)
or the number of in-bounds elements; a window with no in-bounds element gives 0.
"""
from __future__ import annotations

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.capture.graph import Graph, OpNode
from kernelwright.codegen.node_kernels import NodeKernel, OneTensorOp
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
from kernelwright.ops import POOLS
from kernelwright.space.axes import Axis, Space, next_pow2, pow2_range
from kernelwright.space.config import Config

TEMPLATE_NAME = "triton.pool"

TARGETS = POOLS  # target -> (kind, pooled dims)
# argument names after `self`, in schema order
_MAX_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
_AVG_ARGS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
DTYPES = {"float32": "tl.float32", "float16": "tl.float32", "bfloat16": "tl.float32", "float64": "tl.float64"}
_INT32_LIMIT = 2**31 - 1


def _expand(value, nd: int, what: str) -> list[int]:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be ints, got {value!r}")
    if isinstance(value, int):
        return [value] * nd
    vals = [int(v) for v in value]
    if len(vals) == 1:
        return vals * nd
    if len(vals) != nd:
        raise ValueError(f"{what} has {len(vals)} entries for {nd} pooled dims")
    return vals


def pool_params(node: OpNode) -> dict:
    """The pooling arguments of `node` with PyTorch's defaults filled in, one entry per pooled dim."""
    kind, nd = TARGETS[node.target]
    names = _MAX_ARGS if kind == "max" else _AVG_ARGS
    got = dict(zip(names, node.args[1:]))
    got.update({k: v for k, v in node.kwargs.items() if k in names})
    k = _expand(got["kernel_size"], nd, "kernel_size")
    stride = got.get("stride")
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _expand(stride, nd, "stride")
    p = _expand(got.get("padding", 0), nd, "padding")
    d = _expand(got.get("dilation", 1), nd, "dilation") if kind == "max" else [1] * nd
    div = got.get("divisor_override")
    return dict(kind=kind, nd=nd, kernel=k, stride=s, padding=p, dilation=d, ceil_mode=bool(got.get("ceil_mode", False)),
                count_include_pad=bool(got.get("count_include_pad", True)), divisor_override=None if div is None else int(div))


def _layouts(x, node: OpNode) -> tuple[str, str] | None:
    """(input layout, output layout), each "contiguous" or "cl" (channels-last), or None where either
    side is neither or the outputs disagree. The kernel walks the outputs in the input's memory order
    (the window reads, several per output, stay coalesced) and stores each output at its place in
    the output's layout: a channels-last input pooled into a contiguous result (as aten.avg_pool3d
    returns one) is one pass, with no copy of the input."""
    nd = TARGETS[node.target][1]
    sides = []
    for m in [x] + [m for m in node.outs if m is not None]:
        sides.append("contiguous" if m.contiguous else "cl" if len(m.shape) == nd + 2 and m.channels_last else None)
    if None in sides or len(set(sides[1:])) > 1:
        return None
    return sides[0], (sides[1] if len(sides) > 1 else sides[0])


def _geometry(graph: Graph, node: OpNode) -> dict:
    """Input/output sizes viewed as [NC, D, H, W] -> [NC, OD, OH, OW] plus the padded-to-3-D window."""
    pp = pool_params(node)
    nd = pp["nd"]
    x = graph.meta(node.args[0].name)
    y = node.outs[0]
    lead = 1
    for s in x.shape[:-nd]:
        lead *= s
    ins = [1] * (3 - nd) + list(x.shape[-nd:])
    outs = [1] * (3 - nd) + list(y.shape[-nd:])
    pad3 = lambda v, fill: [fill] * (3 - nd) + list(v)  # noqa: E731
    total = y.numel
    return dict(pp, x=x, y=y, NC=lead, C=x.shape[1] if len(x.shape) >= 2 else 1, ins=ins, outs=outs, total=total,
                K=pad3(pp["kernel"], 1), S=pad3(pp["stride"], 1), P=pad3(pp["padding"], 0), DL=pad3(pp["dilation"], 1))


class PoolTemplate(OneTensorOp):
    """Node template for max/avg pooling (see the module docstring)."""

    name = TEMPLATE_NAME

    TARGETS = TARGETS
    KIND = "pooling op"

    # -- applicability ------------------------------------------------------------------------
    def check(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        x = graph.meta(node.args[0].name)
        if x is None or not node.outs or node.outs[0] is None:
            return "missing tensor metadata"
        kind, nd = TARGETS[node.target]
        if x.dtype not in DTYPES:
            return f"unsupported dtype {x.dtype}"
        if len(x.shape) < nd + 1:
            return f"input rank {len(x.shape)} too small for a {nd}-D pool"
        if _layouts(x, node) is None:
            return (f"input and outputs are not each contiguous or channels-last (strides {list(x.stride)} -> "
                    f"{[list(m.stride) for m in node.outs if m is not None]})")
        try:
            pp = pool_params(node)
        except (KeyError, ValueError, TypeError) as e:
            return f"cannot read pooling arguments: {e}"
        if min(pp["kernel"] + pp["stride"] + pp["dilation"]) < 1 or min(pp["padding"]) < 0:
            return "kernel, stride and dilation must be >= 1 and padding >= 0"
        if any(2 * p > k for p, k in zip(pp["padding"], pp["kernel"])):
            return "padding larger than half the kernel"
        window = 1
        for k in pp["kernel"]:
            window *= k
        if window > 1024:
            return f"window of {window} elements is too large to unroll"
        if node.outs[0].numel == 0 or x.numel == 0:
            return "empty tensor"
        if kind == "max" and not (set(used) & {0, 1}):
            return "no output is read"
        if kind == "max" and 1 in used and (len(node.outs) < 2 or node.outs[1] is None):
            return "indices output has no metadata"
        return None

    # -- schedules ----------------------------------------------------------------------------
    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        """BLOCK outputs per program (32..2048, at most the output count rounded up to a power of
        two, min 64) x num_warps (1..8), with 1..16 outputs per thread."""
        top = max(64, next_pow2(node.outs[0].numel))

        def fits(c: dict) -> bool:
            per_thread = c["BLOCK"] // (32 * c["num_warps"])
            return c["BLOCK"] <= top and 1 <= per_thread <= 16

        return Space(TEMPLATE_NAME, [Axis("BLOCK", pow2_range(32, 2048)), Axis("num_warps", [1, 2, 4, 8])],
                     [fits], fixed={"num_stages": 1}).configs()

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        """512 outputs per program with 4 warps (4 outputs per thread: enough independent loads in
        flight per window step), halved while that leaves fewer than 4 programs per SM of `spec`
        down to 128; never more than the output count rounded up to a power of two (min 32), and
        num_warps = BLOCK / 128 clamped to 1..4."""
        spec = spec or device_spec()
        total = node.outs[0].numel
        block = min(512, max(32, next_pow2(total)))
        while block > 128 and -(-total // block) < 4 * spec.sms:
            block //= 2
        nw = max(1, min(4, block // 128))
        return Config.make(TEMPLATE_NAME, BLOCK=block, num_warps=nw, num_stages=1)

    # -- rendering ----------------------------------------------------------------------------
    def render(self, graph: Graph, node: OpNode, config, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"triton.pool cannot render {node.name}: {why}")
        return render_pool(graph, node, config, used)


def render_pool(graph: Graph, node: OpNode, config, used: set[int], chain: dict | None = None) -> NodeKernel:
    """The pool kernel module of `node` for `config`. `chain` (codegen/pool_chain.py) fills the
    template's hooks: the kernel's pointer parameters, the statements before the window loop
    (`hoisted`), those computing each window element `v` from them (`prologue`, instead of a
    load of the pool's input), those after pooling (`epilogue`), the launch signature and the
    output's metadata (`out`) and its inputs (`inputs`)."""
    cfg = config.as_dict() if isinstance(config, Config) else dict(config)
    g = _geometry(graph, node)
    x, y = g["x"], (chain or {}).get("out", g["y"])
    kind = g["kind"]
    layout_in, layout_out = _layouts(x, node)
    if chain is not None:  # (the epilogue may write another layout than the pool's own: a model output)
        layout_out = "contiguous" if y.contiguous else "cl"
    store_values = kind == "avg" or 0 in used
    store_indices = kind == "max" and 1 in used
    n_out = len(node.outs)
    allocs, call = [], list((chain or {}).get("ptrs", ["x"]))
    if store_values:
        allocs.append(f"out = _alloc({tuple(y.shape)!r}, torch.{y.dtype}, {call[0]}.device, {tuple(y.stride)!r})")
        call.append("out")
    if store_indices:
        allocs.append(f"idx = _alloc({tuple(node.outs[1].shape)!r}, torch.int64, {call[0]}.device, {tuple(node.outs[1].stride)!r})")
        call.append("idx")
    rets = ["out" if store_values else "None"]
    if n_out > 1 and chain is None:  # (a chain returns its one result)
        rets.append("idx" if store_indices else "None")
        rets += ["None"] * (n_out - len(rets))
    D, H, W = g["ins"]
    OD, OH, OW = g["outs"]
    KD, KH, KW = g["K"]
    block = int(cfg.get("BLOCK", 256))
    C = g["C"]
    if layout_in != layout_out:  # [block // cb pixels, cb channels] tiles (the template says why)
        cb = min(32, next_pow2(C), block)
        n_cb = -(-C // cb)
        programs = f"{n_cb} * _cdiv({g['total'] // C}, {block // cb})"
        tile = "[BLOCK // CB, CB]"
    else:
        cb, n_cb, programs, tile = 0, 1, f"_cdiv({g['total']}, {block})", "[BLOCK]"
    int64 = max(x.numel, y.numel, (chain or {}).get("numel", 0)) + block > _INT32_LIMIT
    writes = ", ".join((["values"] if store_values else []) + (["indices"] if store_indices else []))
    text = triton_template("pool.py.j2").render(
        kind=kind, node=node.name, cl=layout_in == "cl", cl_out=layout_out == "cl", C=C, CB=cb, n_cb=n_cb,
        programs=programs, tile=tile, target=node.target, nd=g["nd"], dtype=x.dtype, acc=DTYPES[x.dtype],
        in_shape=tuple(x.shape), in_stride=tuple(x.stride), out_shape=tuple(y.shape),
        dhw=(D, H, W), flat_in=[g["NC"], D, H, W], flat_out=[g["NC"], OD, OH, OW],
        ks=g["kernel"], st=g["stride"], pd=g["padding"], dl=g["dilation"], ceil=g["ceil_mode"],
        cip=g["count_include_pad"], divisor_override=g["divisor_override"], writes=writes,
        kernel=f"{node.name}_pool_kernel", store_values=store_values, store_indices=store_indices,
        int64=int64, total=g["total"], D=D, H=H, W=W, OD=OD, OH=OH, OW=OW, KD=KD, KH=KH, KW=KW,
        SD=g["S"][0], SH=g["S"][1], SW=g["S"][2], PD=g["P"][0], PH=g["P"][1], PW=g["P"][2],
        DD=g["DL"][0], DH=g["DL"][1], DW=g["DL"][2], BLOCK=block,
        num_warps=int(cfg.get("num_warps", 4)), num_stages=int(cfg.get("num_stages", 1)),
        input_repr=repr(node.args[0].name), allocs=allocs, call_args=", ".join(call),
        returns="(" + ", ".join(rets) + ",)",
        returns_doc=", ".join(("values" if r == "out" else "indices" if r == "idx" else "None") for r in rets),
        chain=chain,
    )
    inputs = (chain or {}).get("inputs", [node.args[0].name])
    return NodeKernel(source=with_helpers(text), inputs=inputs, outputs=len(rets))


TEMPLATE = PoolTemplate()
