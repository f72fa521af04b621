"""A node template for `scaled_dot_product_attention` (the by-hand attention plan/attention.py
rewrites into one call): a fused Triton kernel (templates/triton/attention.py.j2), searched against
PyTorch's SDPA.

Each program owns BLOCK_M queries of one (batch, head) and walks the keys in blocks of BLOCK_N with
the online softmax (running maximum and sum in float32, exp2 on scores scaled by scale * log2(e)),
never writing the [.., S, L] scores. The products run under the precision policy: IEEE float32
dots under fp32, TF32 operands with float32 accumulation under tf32 (what torch.compile's by-hand
path does with its TF32 bmms, where PyTorch's fused SDPA has no TF32 kernel), bf16 operands under
bf16 with the probabilities rounded to bf16 for the second product (as the flash kernels do).

q, k, v and the boolean mask are read in place with their own strides (the heads of a projection
split by views need no copy), and the result is written in the node's layout ([b, h, s, d] stored
as [b, s, h, d], capture.execute.FIXED_LAYOUT). Under is_causal the key blocks past each query
block are not visited; under a boolean mask a key block the mask leaves out for every query of the
program is skipped after its mask tile is read (a lower-triangular mask, a sliding window: no
check on the host, nothing cached between calls). A row masked entirely is NaN, as in eager.
"""
from __future__ import annotations

import math

from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.templating import triton_template
from kernelwright.space.axes import Axis, Space, next_pow2
from kernelwright.space.config import Config

NAME = "triton.attention"
SDPA = "aten.scaled_dot_product_attention.default"
DTYPES = ("float32", "bfloat16", "float16")
MAX_HEAD_DIM = 256
SMEM_BYTES = 160 * 1024  # the operand tiles a config may stage (below the H100 / H200's 227 KB)
DOTS = {"fp32": "ieee", "tf32": "tf32"}  # float32 operands' tl.dot input precision per policy


def meta4(meta):
    """(shape, strides) of a 3-D [b, s, d] or 4-D [b, h, s, d] operand as 4-D (one head)."""
    if len(meta.shape) == 3:
        return (meta.shape[0], 1, *meta.shape[1:]), (meta.stride[0], 0, *meta.stride[1:])
    return tuple(meta.shape), tuple(meta.stride)


def _mask_strides(shape, stride, full) -> tuple[int, ...] | None:
    """Strides reading a mask of (shape, stride) broadcast to the 4-D `full`, or None."""
    if len(shape) > 4:
        return None
    shape, stride = (1,) * (4 - len(shape)) + tuple(shape), (0,) * (4 - len(stride)) + tuple(stride)
    out = []
    for n, s, f in zip(shape, stride, full):
        if n not in (1, f):
            return None
        out.append(0 if n == 1 else s)
    return tuple(out)


class _Call:
    """The SDPA node's operands, as the kernel reads them."""

    def __init__(self, graph: Graph, node: OpNode):
        args = list(node.args) + [None] * (6 - len(node.args))
        q, k, v, mask, dropout, causal = args[:6]
        self.kwargs = dict(node.kwargs)
        if not all(isinstance(x, Ref) for x in (q, k, v)):
            raise ValueError("q, k and v are not tensor values")
        self.q, self.k, self.v = q.name, k.name, v.name
        self.mask = mask.name if isinstance(mask, Ref) else None
        if mask is not None and self.mask is None:
            raise ValueError("the mask is not a tensor value")
        self.dropout = float(dropout or 0.0)
        self.causal = bool(causal or self.kwargs.get("is_causal", False))
        self.metas = [graph.meta(n) for n in (self.q, self.k, self.v)]
        self.out = node.meta
        self.mask_meta = graph.meta(self.mask) if self.mask else None

    def check(self) -> str | None:
        if self.dropout != 0.0:
            return "dropout"
        if set(self.kwargs) - {"scale", "is_causal", "enable_gqa"} or self.kwargs.get("enable_gqa"):
            return "arguments other than scale and is_causal"
        if any(m is None for m in self.metas) or self.out is None:
            return "an operand without metadata"
        dtypes = {m.dtype for m in self.metas}
        if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES or self.out.dtype not in dtypes:
            return "q, k, v and the result not of one floating dtype"
        if any(len(m.shape) not in (3, 4) for m in self.metas) or len(self.out.shape) != len(self.metas[0].shape):
            return "operands not 3-D or 4-D"
        (qs, _), (ks, _), (vs, _) = (meta4(m) for m in self.metas)
        if qs[:2] != ks[:2] or ks[:3] != vs[:3] or qs[3] != ks[3]:
            return "q, k, v of other batch or head counts (broadcast, grouped-query) or lengths"
        if max(qs[3], vs[3]) > MAX_HEAD_DIM or 0 in qs or 0 in ks or 0 in vs:
            return f"a head size past {MAX_HEAD_DIM} or an empty operand"
        if self.mask is not None:
            if self.mask_meta is None or self.mask_meta.dtype != "bool":
                return "a mask that is not boolean (an additive float mask)"
            if self.causal:
                return "both a mask and is_causal"
            if _mask_strides(self.mask_meta.shape, self.mask_meta.stride, (*qs[:3], ks[2])) is None:
                return "a mask that does not broadcast to [b, h, s, l]"
        return None

    def sizes(self) -> dict:
        (qs, _), (ks, _), (vs, _) = (meta4(m) for m in self.metas)
        return dict(B=qs[0], H=qs[1], S=qs[2], L=ks[2], D=qs[3], DV=vs[3])


def dot_precision(dtype: str, policy: str | None) -> str:
    """The products' arithmetic: IEEE float32 or TF32 on float32 operands (by policy; IEEE where
    the policy allows no TF32), else the operands' own dtype."""
    if dtype == "float32":
        return DOTS.get(policy or "fp32", "ieee")
    return {"bfloat16": "bf16", "float16": "fp16"}[dtype]


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def attention_space(s: dict, dtype: str, policy: str | None) -> list[Config]:
    """Query and key blocks, warps and stages whose operand tiles fit SMEM_BYTES and whose score
    and accumulator tiles stay at most 128 float32 values a thread."""
    bd, bdv, elt = max(16, next_pow2(s["D"])), max(16, next_pow2(s["DV"])), _bytes(dtype)
    top_m, top_n = max(16, next_pow2(s["S"])), max(16, next_pow2(s["L"]))
    return Space(NAME, [Axis("BLOCK_M", [v for v in (32, 64, 128) if v <= max(32, top_m)]),
                        Axis("BLOCK_N", [v for v in (16, 32, 64, 128) if v <= max(16, top_n)]),
                        Axis("num_warps", [4, 8]), Axis("num_stages", [1, 2, 3]),
                        Axis("DOT", [dot_precision(dtype, policy)])],
                 [lambda c: elt * (c["BLOCK_M"] * bd + c["num_stages"] * c["BLOCK_N"] * (bd + bdv)) <= SMEM_BYTES,
                  lambda c: c["BLOCK_M"] * max(c["BLOCK_N"], bdv) // (32 * c["num_warps"]) <= 128]).configs()


class AttentionTemplate:
    """Node template for scaled_dot_product_attention without dropout, boolean or causal masks."""

    name = NAME
    by_policy = True  # the products' precision (DOT) follows the policy

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target != SDPA:
            return f"{node.target} is not scaled_dot_product_attention"
        try:
            call = _Call(graph, node)
        except ValueError as e:
            return str(e)
        return call.check()

    def _shape(self, graph: Graph, node: OpNode) -> tuple[dict, str]:
        call = _Call(graph, node)
        return call.sizes(), call.metas[0].dtype

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> list[Config]:
        return attention_space(*self._shape(graph, node), policy)

    def seeds(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> list[Config]:
        """The default, then the nearest smaller tiles (fewer registers a thread) that fit."""
        space = self.space(graph, node, spec, policy)
        first = self.default(graph, node, spec, policy)
        want = [first] + [first.replace(**kw) for kw in ({"BLOCK_N": first["BLOCK_N"] // 2},
                                                         {"BLOCK_M": first["BLOCK_M"] // 2, "num_warps": 4})]
        return [c for c in dict.fromkeys(want) if c in space] or space[:1]

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> Config:
        """128 queries x 64 keys with 8 warps and 2 stages (3 for 2-byte operands), the tiles of
        Triton's flash-attention tutorial on Hopper; 64 x 32 with 4 warps for IEEE float32 dots
        (per-thread multiply-adds, no tensor cores); the largest that fits where these do not."""
        s, dtype = self._shape(graph, node)
        space = attention_space(s, dtype, policy)
        ieee = dot_precision(dtype, policy) == "ieee"
        want = (dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2) if ieee else
                dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2 if dtype == "float32" else 3))
        hit = [c for c in space if all(c[k] == v for k, v in want.items())]
        if hit:
            return hit[0]
        return max(space, key=lambda c: (c["BLOCK_M"] * c["BLOCK_N"] <= want["BLOCK_M"] * want["BLOCK_N"],
                                          c["BLOCK_M"] * c["BLOCK_N"], c["num_stages"], -c["num_warps"]))

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        cfg = dict(config.as_dict() if isinstance(config, Config) else config)
        call = _Call(graph, node)
        s = call.sizes()
        (_, qst), (_, kst), (_, vst) = (meta4(m) for m in call.metas)
        _, out_stride = meta4(call.out)
        scale = call.kwargs.get("scale")
        scale = 1.0 / math.sqrt(s["D"]) if scale is None else float(scale)
        dtype = call.metas[0].dtype
        inputs = [call.q, call.k, call.v] + ([call.mask] if call.mask else [])
        mask_stride = (_mask_strides(call.mask_meta.shape, call.mask_meta.stride, (s["B"], s["H"], s["S"], s["L"]))
                       if call.mask else None)
        text = triton_template("attention.py.j2").render(
            node=node.name, kernel=f"{node.name}_attention_kernel", dtype=dtype,
            q=call.q, k=call.k, v=call.v, mask=call.mask, causal=call.causal,
            metas={n: (tuple(m.shape), tuple(m.stride)) for n, m in zip(inputs, call.metas + [call.mask_meta])},
            qst=qst, kst=kst, vst=vst, mst=mask_stride, ost=out_stride, at=tile_offset,
            out_shape=tuple(call.out.shape), out_stride=tuple(call.out.stride),
            scale=scale, qk_scale=scale * math.log2(math.e), dot=None if dtype != "float32" else cfg["DOT"],
            BLOCK_D=max(16, next_pow2(s["D"])), BLOCK_DV=max(16, next_pow2(s["DV"])),
            wide=max(m.span for m in call.metas + [call.out]) >= 2**31,
            **s, **{k: int(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")})
        return NodeKernel(with_helpers(text), inputs, 1)


def tile_offset(strides, rows: str, cols: str) -> str:
    """The offset of a [b, h, rows, cols] tile of a tensor with 4-D `strides` (zero strides left out)."""
    terms = [f"{name} * {st}" if st != 1 else name for name, st in zip(("b", "h", rows, cols), strides) if st != 0]
    return " + ".join(terms) or "0"


TEMPLATE = AttentionTemplate()
