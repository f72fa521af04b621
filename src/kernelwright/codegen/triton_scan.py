"""Triton kernels for prefix scans (`aten.cumsum` / `aten.cumprod`) as a node template.

The input is viewed as [outer, N, inner] around the scanned dim (N elements); the output is a
contiguous float32 tensor of the same shape. Two layouts:

* "rows" (inner == 1, the scanned dim is the output's last dim): one program scans BLOCK_M rows.
  When a row fits one tile (`one_pass`) it is read once, scanned with `tl.cumsum`/`tl.cumprod`
  and written once; otherwise the row is walked in chunks of BLOCK_N, each chunk scanned in tree
  order and combined with the running total (the carry, fp32) of the chunks before it.
* "cols" (inner > 1, a scan over a non-last dim): one program owns BLOCK_INNER neighbouring
  columns of one outer index (coalesced along inner) and scans down N in tiles of
  [BLOCK_N, BLOCK_INNER], carrying one running total per column.

The input is addressed through its own strides (permuted or expanded views need no copy); the
module is specialised for the captured shape and strides and `launch` refuses anything else.
"""
from __future__ import annotations

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.node_kernels import NodeKernel, OneTensorOp
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.templating import triton_template
from kernelwright.space.axes import Axis, Space, next_pow2, pow2_range, union
from kernelwright.space.config import Config

NAME = "triton.scan"
OPS = {"aten.cumsum.default": "sum", "aten.cumprod.default": "prod"}
MAX_TILE = 16384  # elements of one register tile (one-pass rows are at most this long)



# -- geometry ----------------------------------------------------------------------------

class _Geom:
    """The [outer, N, inner] view of one scan node and the input's (collapsed) strides."""

    def __init__(self, graph: Graph, node: OpNode):
        x = node.args[0]
        self.input = x.name
        meta = graph.meta(x.name)
        self.meta = meta
        shape, stride = tuple(meta.shape), tuple(meta.stride)
        nd = len(shape)
        dim = int(node.args[1]) if len(node.args) > 1 else int(node.kwargs["dim"])
        self.dim = dim + nd if dim < 0 else dim
        self.shape, self.stride = shape, stride
        self.N = shape[self.dim]
        self.OUTER = _prod(shape[:self.dim])
        self.INNER = _prod(shape[self.dim + 1:])
        self.SN = stride[self.dim] if self.N > 1 else 0
        self.outer_dims = _collapse(shape[:self.dim], stride[:self.dim])
        self.inner_dims = _collapse(shape[self.dim + 1:], stride[self.dim + 1:])

    @property
    def layout(self) -> str:
        return "rows" if self.INNER == 1 else "cols"


def _prod(xs) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def _collapse(shape, stride) -> list[tuple[int, int]]:
    """(size, stride) pairs, outermost first, without size-1 dims, neighbours merged where the
    outer one steps exactly over the inner one (so a contiguous block becomes one dim)."""
    dims: list[tuple[int, int]] = []
    for n, s in zip(shape, stride):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:
            dims[-1] = (dims[-1][0] * n, s)
        else:
            dims.append((n, s))
    return dims


def _offset(var: str, dims: list[tuple[int, int]], prefix: str) -> tuple[list[str], str]:
    """Lines and an expression giving the input offset of flat (row-major) index `var` over
    `dims`; an empty dims list (everything size 1) gives offset 0."""
    if not dims:
        return [], "0"
    if len(dims) == 1:
        n, s = dims[0]
        return [], var if s == 1 else f"{var} * {s}"
    lines, terms = [], []
    div = 1
    divs = []
    for n, _ in reversed(dims):
        divs.append(div)
        div *= n
    divs.reverse()
    for k, ((n, s), d) in enumerate(zip(dims, divs)):
        c = f"{prefix}{k}"
        if k == 0:
            expr = f"{var} // {d}"
        elif d == 1:
            expr = f"{var} % {n}"
        else:
            expr = f"({var} // {d}) % {n}"
        lines.append(f"{c} = {expr}  # coordinate {k} of {var}")
        if s:
            terms.append(c if s == 1 else f"{c} * {s}")
    return lines, " + ".join(terms) if terms else "0"


# -- the template --------------------------------------------------------------------------

def _warps_fit(tile: int, num_warps: int) -> bool:
    """At most 64 elements per thread, and at least one unless a single warp is used."""
    per_thread = tile // (32 * num_warps)
    return per_thread <= 64 and (per_thread >= 1 or num_warps == 1)


class ScanTemplate(OneTensorOp):
    """Node template for `aten.cumsum.default` / `aten.cumprod.default` on float32 tensors."""

    name = NAME

    TARGETS = OPS
    KIND = "cumsum/cumprod"

    # supports ----------------------------------------------------------------------------
    def check(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        extra = set(node.kwargs) - {"dtype", "dim"}
        if extra:
            return f"unsupported keyword argument(s) {sorted(extra)}"
        if len(node.args) > 2:
            return "unexpected extra positional arguments"
        dtype = node.kwargs.get("dtype")
        if dtype is not None and str(dtype) not in ("torch.float32", "float32"):
            return f"dtype={dtype} (only float32 is supported)"
        meta = graph.meta(node.args[0].name)
        if meta is None:
            return "input has no tensor metadata"
        if meta.dtype != "float32":
            return f"input dtype {meta.dtype} (only float32 is supported)"
        out = node.meta
        if out is None or out.dtype != "float32":
            return f"output dtype {None if out is None else out.dtype} (only float32 is supported)"
        if len(meta.shape) == 0:
            return "0-d input"
        if meta.numel == 0:
            return "empty tensor"
        if max(meta.span + 1, meta.numel) >= 2**31:
            return "tensor too large for the kernel's int32 in-row offsets"
        if tuple(out.shape) != tuple(meta.shape):
            return "output shape differs from the input shape"
        if not out.contiguous:
            return "the recorded output is not contiguous"
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if not isinstance(dim, int) or isinstance(dim, bool) or not -len(meta.shape) <= dim < len(meta.shape):
            return f"dim {dim!r} is not a valid static dim"
        if 0 not in used:
            return "the scan output is not read"
        return None

    # space -------------------------------------------------------------------------------
    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> list[Config]:
        g = _Geom(graph, node)
        warps = [1, 2, 4, 8, 16]
        np2 = next_pow2(g.N)
        if g.layout == "rows":
            mp = next_pow2(g.OUTER)
            spaces = []
            if np2 <= MAX_TILE:
                # one pass: the whole row in one tile, BLOCK_M rows per program
                spaces.append(Space(NAME, [Axis("BLOCK_M", pow2_range(1, 64)), Axis("num_warps", warps)],
                                    [lambda c: c["BLOCK_M"] <= mp and c["BLOCK_M"] * np2 <= MAX_TILE,
                                     lambda c: _warps_fit(c["BLOCK_M"] * np2, c["num_warps"])],
                                    fixed={"BLOCK_N": np2, "one_pass": True, "num_stages": 1}))
            if np2 >= 32:
                # chunks shorter than the row, carried along
                spaces.append(Space(NAME, [Axis("BLOCK_M", pow2_range(1, 16)),
                                           Axis("BLOCK_N", pow2_range(16, min(np2 // 2, 4096))),
                                           Axis("num_warps", warps)],
                                    [lambda c: c["BLOCK_M"] <= mp and 256 <= c["BLOCK_M"] * c["BLOCK_N"] <= 8192,
                                     lambda c: _warps_fit(c["BLOCK_M"] * c["BLOCK_N"], c["num_warps"])],
                                    fixed={"one_pass": False, "num_stages": 1}))
            configs = union(*spaces)
        else:
            ip = next_pow2(g.INNER)
            inner_vals = pow2_range(min(16, ip), min(ip, 512))
            spaces = []
            if np2 * min(16, ip) <= MAX_TILE:
                spaces.append(Space(NAME, [Axis("BLOCK_INNER", inner_vals), Axis("num_warps", warps)],
                                    [lambda c: c["BLOCK_INNER"] * np2 <= MAX_TILE,
                                     lambda c: _warps_fit(c["BLOCK_INNER"] * np2, c["num_warps"])],
                                    fixed={"BLOCK_N": np2, "one_pass": True, "num_stages": 1}))
            if np2 >= 2:
                spaces.append(Space(NAME, [Axis("BLOCK_INNER", inner_vals),
                                           Axis("BLOCK_N", pow2_range(1, min(np2 // 2, 256))),
                                           Axis("num_warps", warps)],
                                    [lambda c: c["BLOCK_INNER"] * c["BLOCK_N"] <= 8192,
                                     lambda c: _warps_fit(c["BLOCK_INNER"] * c["BLOCK_N"], c["num_warps"])],
                                    fixed={"one_pass": False, "num_stages": 1}))
            configs = union(*spaces)
        base = self._default(graph, node, spec)
        if base not in configs:
            configs.insert(0, base)
        kind = self.pattern_kind(graph, node)
        if kind:
            configs = [c.replace(**{kind: True}) for c in configs]
        return configs

    # default -----------------------------------------------------------------------------
    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None) -> Config:
        base = self._default(graph, node, spec)
        kind = self.pattern_kind(graph, node)
        return base.replace(**{kind: True}) if kind else base

    def _default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None) -> Config:
        """The heuristic used when nothing can be timed.

        rows (scan along the output's last dim): rows up to 4096 elements are scanned in one
        pass, with as many rows per program (at most 64) as make a tile of about 2048 elements;
        4 warps for tiles up to 2048 elements, 8 above. Longer rows go in 2048-element chunks
        with a carry, one row per program, 8 warps.
        cols (scan along a non-last dim): 128 inner columns per program, halved (down to 16)
        while there would be fewer than two programs per SM of `spec`; BLOCK_N makes a tile of about 2048
        elements (one pass when the whole column fits); 4 warps.
        Warps are halved while a tile has fewer elements than threads."""
        g = _Geom(graph, node)
        np2 = next_pow2(g.N)
        if g.layout == "rows":
            if np2 <= 4096:
                bm = max(1, min(next_pow2(g.OUTER), 2048 // np2, 64))
                tile = bm * np2
                nw = 4 if tile <= 2048 else 8
                while nw > 1 and tile < 32 * nw:
                    nw //= 2
                return Config.make(NAME, BLOCK_M=bm, BLOCK_N=np2, one_pass=True, num_warps=nw, num_stages=1)
            return Config.make(NAME, BLOCK_M=1, BLOCK_N=2048, one_pass=False, num_warps=8, num_stages=1)
        ip = next_pow2(g.INNER)
        bi = min(ip, 128)
        programs = 2 * (spec or device_spec()).sms
        while bi > 16 and g.OUTER * -(-g.INNER // bi) < programs:
            bi //= 2
        bn = max(1, min(np2, 2048 // bi))
        tile = bi * bn
        nw = 4
        while nw > 1 and tile < 32 * nw:
            nw //= 2
        return Config.make(NAME, BLOCK_INNER=bi, BLOCK_N=bn, one_pass=bn >= g.N, num_warps=nw, num_stages=1)

    # flip -> scan -> flip, and cat([neutral, x[:-1]]) -> scan -----------------------------
    def absorbed(self, graph: Graph, node: OpNode) -> tuple[list[str], str, str] | None:
        """Neighbouring nodes one kernel can compute with the scan, each value read only by the next:
        flip(x, [d]) -> cumsum(d) -> flip([d]) (a reverse scan: x is read backwards), or
        cat([full_like(.., neutral), slice(x, d, 0, N-1)], d) -> scan (an exclusive scan: x is read
        shifted by one). Returns (the nodes, x, the value the kernel produces) or None."""
        return self._reverse_pattern(graph, node) or self._exclusive_pattern(graph, node)

    def pattern_kind(self, graph: Graph, node: OpNode) -> str:
        if self._reverse_pattern(graph, node):
            return "reverse"
        return "exclusive" if self._exclusive_pattern(graph, node) else ""

    def _exclusive_pattern(self, graph: Graph, node: OpNode):
        src = node.args[0] if node.args else None
        if not isinstance(src, Ref) or graph.is_input(src.name) or len(graph.users(src.name)) != 1:
            return None
        cat = graph.node(src.name)
        ndim = len(node.meta.shape)
        dim = int(node.args[1]) % ndim
        if cat.target != "aten.cat.default" or len(cat.args[0]) != 2 or int(cat.args[1] if len(cat.args) > 1 else 0) % ndim != dim:
            return None
        fill, body = cat.args[0]
        if not (isinstance(fill, Ref) and isinstance(body, Ref)) or graph.is_input(fill.name) or graph.is_input(body.name):
            return None
        fill_n, body_n = graph.node(fill.name), graph.node(body.name)
        neutral = 0.0 if node.target == "aten.cumsum.default" else 1.0
        if fill_n.target != "aten.full_like.default" or float(fill_n.args[1]) != neutral or fill_n.meta.shape[dim] != 1:
            return None
        if body_n.target != "aten.slice.Tensor" or len(graph.users(body_n.name)) != 1 or len(graph.users(fill_n.name)) != 1:
            return None
        x = body_n.args[0]
        step = body_n.args[4] if len(body_n.args) > 4 else 1
        if not isinstance(x, Ref) or int(body_n.args[1]) % ndim != dim or body_n.args[2] not in (0, None) or step != 1:
            return None
        xm = graph.meta(x.name)
        if xm is None or xm.dtype != "float32" or tuple(xm.shape) != tuple(node.meta.shape):
            return None
        nodes = [fill_n.name, body_n.name, cat.name, node.name]
        like = fill_n.args[0]  # the slice full_like copies its shape from, if only read there
        if isinstance(like, Ref) and not graph.is_input(like.name) and len(graph.users(like.name)) == 1 \
                and graph.node(like.name).target == "aten.slice.Tensor":
            nodes.insert(0, like.name)
        if set(nodes[:-1]) & (set(graph.outputs) | set(graph.mutations)):
            return None
        return nodes, x.name, node.name

    def _reverse_pattern(self, graph: Graph, node: OpNode):
        src = node.args[0] if node.args else None
        if not isinstance(src, Ref) or graph.is_input(src.name):
            return None
        first = graph.node(src.name)
        users = graph.users(node.name)
        if first.target != "aten.flip.default" or len(users) != 1 or users[0].target != "aten.flip.default":
            return None
        last = users[0]
        ndim = len(node.meta.shape)
        dim = int(node.args[1]) % ndim
        if any([int(d) % ndim for d in n.args[1]] != [dim] for n in (first, last)):
            return None
        if len(graph.users(first.name)) != 1 or {first.name, node.name} & (set(graph.outputs) | set(graph.mutations)):
            return None
        x = first.args[0]
        if not isinstance(x, Ref) or graph.meta(x.name) is None or graph.meta(x.name).dtype != "float32":
            return None
        return [first.name, node.name, last.name], x.name, last.name

    # render ------------------------------------------------------------------------------
    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        cfg = dict(config.as_dict() if isinstance(config, Config) else config)
        reverse, exclusive = bool(cfg.get("reverse", False)), bool(cfg.get("exclusive", False))
        if reverse or exclusive:
            pattern = self._reverse_pattern(graph, node) if reverse else self._exclusive_pattern(graph, node)
            if pattern is None:
                raise ValueError(f"{NAME}: {'reverse' if reverse else 'exclusive'}=True needs its pattern around {node.name}")
            node = OpNode(node.name, node.target, (Ref(pattern[1]),) + tuple(node.args[1:]), node.kwargs, node.outs)
        g = _Geom(graph, node)
        op = OPS[node.target]
        BLOCK_N = int(cfg["BLOCK_N"])
        one_pass = bool(cfg.get("one_pass", BLOCK_N >= g.N))
        if one_pass and BLOCK_N < g.N:
            raise ValueError(f"{NAME}: one_pass needs BLOCK_N >= {g.N}, got {BLOCK_N}")
        if BLOCK_N < 1 or BLOCK_N & (BLOCK_N - 1):
            raise ValueError(f"{NAME}: BLOCK_N must be a power of two, got {BLOCK_N}")
        ctx = dict(
            op=op, node=node.name, target=node.target, input=g.input, input_r=repr(g.input),
            kernel=f"{_ident(node.name)}_scan_kernel",
            dim=g.dim, in_shape=list(g.shape), in_stride=list(g.stride), out_shape=list(g.shape),
            in_shape_t=repr(tuple(g.shape)), in_stride_t=repr(tuple(g.stride)), out_shape_t=repr(tuple(g.shape)),
            OUTER=g.OUTER, N=g.N, INNER=g.INNER, SN=g.SN, layout=g.layout, one_pass=one_pass,
            neutral="0.0" if op == "sum" else "1.0", combine="+" if op == "sum" else "*",
            num_warps=int(cfg.get("num_warps", 4)), num_stages=int(cfg.get("num_stages", 1)), BLOCK_N=BLOCK_N,
            reverse=reverse, exclusive=exclusive,
            # logical scan position -> element index along the scanned dim (mirrored for a reverse scan)
            pos_one=f"({g.N - 1} - {'cols' if g.layout == 'rows' else 'rows'})" if reverse else
            ("cols" if g.layout == "rows" else "rows"),
            pos_chunk=f"({g.N - 1} - n)" if reverse else "n",
        )
        # the element loaded at each position: the same one, or (exclusive) the one before it
        one = "cols" if g.layout == "rows" else "rows"
        ctx.update(load_one=f"({one} - 1)" if exclusive else ctx["pos_one"], lmask_one=f" & ({one} >= 1)" if exclusive else "",
                   load_chunk="(n - 1)" if exclusive else ctx["pos_chunk"], lmask_chunk=" & (n >= 1)" if exclusive else "")
        if g.layout == "rows":
            BLOCK_M = int(cfg.get("BLOCK_M", 1))
            o_lines, x_outer = _offset("m", g.outer_dims, "mc")
            ctx.update(BLOCK_M=BLOCK_M, x_outer=x_outer, outer_lines=o_lines, grid=f"_cdiv({g.OUTER}, {BLOCK_M})",
                       scan_rows=_scan(op, 1))
        else:
            BLOCK_INNER = int(cfg.get("BLOCK_INNER", 32))
            nib = -(-g.INNER // BLOCK_INNER)
            o_lines, x_outer = _offset("o", g.outer_dims, "oc")
            i_lines, x_inner = _offset("i", g.inner_dims, "ic")
            ctx.update(BLOCK_INNER=BLOCK_INNER, NIB=nib, x_outer=x_outer, outer_lines=o_lines,
                       x_inner=x_inner, inner_lines=i_lines, grid=str(g.OUTER * nib), scan_cols=_scan(op, 0))
        text = triton_template("scan.py.j2").render(**ctx)
        return NodeKernel(with_helpers(text), [g.input], 1)


def _scan(op: str, axis: int) -> str:
    return f"tl.cumsum(x, axis={axis})" if op == "sum" else f"tl.cumprod(x, axis={axis})"


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out if out and not out[0].isdigit() else "n_" + out


TEMPLATE = ScanTemplate()

__all__ = ["TEMPLATE", "ScanTemplate"]
