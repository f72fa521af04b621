"""A node template for transposed convolutions: cuDNN's forward convolution, which it runs through
other (often much faster) kernels than the transposed call's data-gradient path.

Stride 1 ("forward"): the forward convolution of the same input with the flipped kernel, its
channel axes swapped, and padding d * (k - 1) - p per axis: y[o] = sum_k x[o - k d + p] w[k]
= sum_k' x[o + k' d - P] w[K - 1 - k'] with P = d (K - 1) - p (exact in real arithmetic).

Stride s > 1 ("subpixel", undilated): an output o = q s + r (phase r) takes the taps k = t_r + s m
with t_r = (r + p) mod s, at input q + c_r - m, c_r = (r + p) div s. Per axis the phases' kernels
w[t_r + s (M - 1 - m')], M = ceil(K / s) taps (zero past K), stacked as s^n output channels per
channel, make one forward convolution Z of the input, and y[q s + r] = Z[c s^n + r, q + base + c_r - c_0]:
a strided view of Z when c_r - c_0 is linear in r (any stride with p a multiple of it; stride 2
always), copied once into the output's layout. The forward convolution computes (s M / K)^n times
the transposed one's products (1 for K = 4, s = 2; 16/9 per 2-D for K = 3).

Stride s > 1 ("phases", undilated): the same phases as s^n forward convolutions, each with its own
taps only (w[t_r::s] reversed, ceil((K - t_r) / s) of them per axis), so the products are the
transposed convolution's, each written into its phase of the output: more, smaller launches.

Either form ships only where it measures faster than cuDNN's transposed call, like every other
candidate.
"""
from __future__ import annotations

import itertools
import math

from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.conv_args import CONV
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.templating import triton_template
from kernelwright.space.config import Config

NAME = "torch.conv_transpose_as_conv"


def _ints(v, nd: int) -> list[int]:
    return [int(v)] * nd if isinstance(v, int) else [int(x) for x in v]


def _forward_rows(size: int, taps: int, first: int, last: int) -> tuple[int, int, int]:
    """(padding P, row `base`, rows J) of the forward convolution with `taps` taps over an axis of
    `size` whose row q + base holds output row q of a phase reading input rows from q + first -
    taps + 1: P is widened on both sides until row `last` + base exists."""
    pad = max(0, taps - 1 - first)
    base, rows = first - taps + 1 + pad, size + 2 * pad - taps + 1
    while last + base >= rows:
        pad, base, rows = pad + 1, base + 1, rows + 2
    return pad, base, rows


def subpixel_plan(size: int, k: int, s: int, p: int, op: int) -> dict | None:
    """The forward convolution of one axis for the subpixel form (module docstring): taps M, its
    padding P, the first row `base` of Z that phase 0 reads, the phase offset c_r - c_0 = alpha r
    + beta, Q rows per phase, the output's O and Z's J rows; None when c_r - c_0 is not linear in r."""
    out = (size - 1) * s - 2 * p + k + op
    taps = -(-k // s)
    c = [(r + p) // s for r in range(s)]
    d = [x - c[0] for x in c]
    alpha = d[1] - d[0] if s > 1 else 0
    if any(d[r] != alpha * r for r in range(s)):
        return None
    q = -(-out // s)
    pad, base, rows = _forward_rows(size, taps, c[0], q - 1 + max(d))  # (the last phase's last row)
    return dict(M=taps, P=pad, base=base, alpha=alpha, Q=q, O=out, J=rows)


class ConvTransposeForwardTemplate:
    """Node template: a transposed convolution as cuDNN's forward convolution (module docstring);
    one config, its form."""

    name = NAME

    def space(self, graph: Graph, node: OpNode, spec=None) -> list[Config]:
        """forward (stride 1); else subpixel (where its phases are one strided view) and phases, the
        first the one timed at the smallest budgets: subpixel while it computes at most 1.5 times the
        products (K a multiple of s, or one axis of K = 3 at s = 2), else phases (an unmeasured rule)."""
        plans = self._plans(graph, node)
        if plans is None:
            return [Config.make(NAME, form="forward")]
        phases = [Config.make(NAME, form="phases")]
        if None in plans:
            return phases
        k = graph.meta(node.args[1].name).shape[2:]
        waste = math.prod(q["M"] * sa / ka for q, sa, ka in zip(plans, _ints(node.args[3], len(k)), k))
        sub = [Config.make(NAME, form="subpixel")]
        return sub + phases if waste <= 1.5 else phases + sub

    def default(self, graph: Graph, node: OpNode, spec=None) -> Config:
        return self.space(graph, node, spec)[0]

    @staticmethod
    def _plans(graph: Graph, node: OpNode) -> list | None:
        """The subpixel plan of each axis (None where it is not one view); None for stride 1."""
        x, w, _, stride, padding, _, _, output_padding = node.args[:8]
        nd = len(node.meta.shape) - 2
        if _ints(stride, nd) == [1] * nd:
            return None
        return [subpixel_plan(*a) for a in zip(graph.meta(x.name).shape[2:], graph.meta(w.name).shape[2:],
                                               _ints(stride, nd), _ints(padding, nd), _ints(output_padding, nd))]

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target != CONV or len(node.args) < 9:
            return "not a convolution"
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args[:9]
        if not transposed:
            return "not a transposed convolution"
        if not (isinstance(x, Ref) and isinstance(w, Ref)) or (b is not None and not isinstance(b, Ref)):
            return "operands are not tensor values"
        xm, wm = graph.meta(x.name), graph.meta(w.name)
        if xm is None or wm is None or node.meta is None or not 3 <= len(xm.shape) <= 5 \
                or xm.dtype not in ("float16", "bfloat16", "float32", "float64") or wm.dtype != xm.dtype:
            return "only 1-3-D floating-point convolutions with operands of one dtype"
        nd = len(xm.shape) - 2
        k = list(wm.shape[2:])
        if _ints(stride, nd) != [1] * nd:
            return "a dilated strided transposed convolution" if _ints(dilation, nd) != [1] * nd else None
        if _ints(output_padding, nd) != [0] * nd:
            return "output_padding with stride 1"
        if any(p > d * (kk - 1) for p, d, kk in zip(_ints(padding, nd), _ints(dilation, nd), k)):
            return "padding wider than the dilated kernel: the forward convolution would need negative padding"
        return None

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        x, w, b, stride, padding, dilation, _, output_padding, groups = node.args[:9]
        xm, wm, ym = graph.meta(x.name), graph.meta(w.name), node.meta
        nd = len(xm.shape) - 2
        k = list(wm.shape[2:])
        fmt = {4: "torch.channels_last", 5: "torch.channels_last_3d"}.get(len(ym.shape))
        y_cl, x_cl = ym.channels_last and not ym.contiguous, xm.channels_last and not xm.contiguous
        args = ["x", "w"] + (["b"] if isinstance(b, Ref) else [])
        common = dict(node=node.name, args=args, bias="b" if isinstance(b, Ref) else "None", groups=int(groups),
                      cin=int(wm.shape[0]), cout_g=int(wm.shape[1]), ones=[1] * nd, zeros=[0] * nd,
                      w_format=fmt if x_cl else "torch.contiguous_format",
                      y_format=fmt if y_cl else "torch.contiguous_format",
                      input_shape=list(xm.shape), weight_shape=list(wm.shape), out_shape=list(ym.shape))
        if config.get("form", "forward") == "forward":
            pad = [d * (kk - 1) - p for p, d, kk in zip(_ints(padding, nd), _ints(dilation, nd), k)]
            text = triton_template("conv_transpose_forward.py.j2").render(
                form="forward", kernel=k, flip=list(range(2, 2 + nd)), padding=pad, dilation=_ints(dilation, nd),
                **common)
        elif config["form"] == "phases":
            text = self._render_phases(node, xm, k, _ints(stride, nd), _ints(padding, nd), common)
        else:
            s, p = _ints(stride, nd), _ints(padding, nd)
            plans = [subpixel_plan(*a) for a in zip(xm.shape[2:], k, s, p, _ints(output_padding, nd))]
            if None in plans:
                raise ValueError(f"{NAME} cannot render {node.name} as subpixel: its phases are not one view")
            phases = math.prod(s)
            taps = [q["M"] for q in plans]
            # Z's element strides are read at run time; the view's size and its stride multipliers
            # per axis: (rows Q, stride of Z's axis), (phases s, channel stride * phases inside it
            # + alpha * stride of Z's axis)
            strides, offset = ["st[0]", f"st[1] * {phases}"], "z.storage_offset()"
            for a, q in enumerate(plans):
                inner = math.prod(s[a + 1:])
                strides += [f"st[{2 + a}]", (f"st[1] * {inner}" if inner > 1 else "st[1]")
                            + (f" {'+' if q['alpha'] > 0 else '-'} st[{2 + a}]" if q["alpha"] else "")]
                offset += f" + {q['base']} * st[{2 + a}]" if q["base"] else ""
            text = triton_template("conv_transpose_forward.py.j2").render(
                form="subpixel", stride=s, phases=phases, taps=taps, strides=strides, offset=offset,
                w_pad=[v for a in reversed(range(nd)) for v in (0, taps[a] * s[a] - k[a])],
                w_split=[v for a in range(nd) for v in (taps[a], s[a])],
                flip=[2 + 2 * a for a in range(nd)], roll=[-(p[a] % s[a]) for a in range(nd)],
                roll_dims=[3 + 2 * a for a in range(nd)],
                perm=[0, 2] + [4 + 2 * a for a in range(nd)] + [1] + [3 + 2 * a for a in range(nd)],
                z_pad=[q["P"] for q in plans], full=[q["Q"] * sa for q, sa in zip(plans, s)],
                view6=[v for q, sa in zip(plans, s) for v in (q["Q"], sa)],
                crop_slices=", ".join(f":{q['O']}" for q in plans),
                cropped=any(q["Q"] * sa != q["O"] for q, sa in zip(plans, s)), nd=nd, **common)
        return NodeKernel(text, [x.name, w.name] + ([b.name] if isinstance(b, Ref) else []), 1)

    @staticmethod
    def _render_phases(node, xm, k, s, p, common) -> str:
        nd = len(k)
        sizes, out = list(xm.shape[2:]), list(node.meta.shape[2:])
        q = [-(-o // sa) for o, sa in zip(out, s)]
        phases = []
        for r in itertools.product(*[range(sa) for sa in s]):
            taps, pads, starts = [], [], []
            for a in range(nd):
                t, c = (r[a] + p[a]) % s[a], (r[a] + p[a]) // s[a]
                m = -(-(k[a] - t) // s[a]) if k[a] > t else 0
                pad, base, _ = _forward_rows(sizes[a], m, c, q[a] - 1)
                taps.append((t, m))
                pads.append(pad)
                starts.append(base)
            phases.append(dict(
                r=list(r), taps=[m for _, m in taps], empty=any(m == 0 for _, m in taps),
                w_slice=", ".join(f"{t}::{sa}" for (t, _), sa in zip(taps, s)), pads=pads,
                z_slice=", ".join(f"{b0}:{b0 + qa}" for b0, qa in zip(starts, q)),
                y_slice=", ".join(f":, {ra}" for ra in r)))
        return triton_template("conv_transpose_forward.py.j2").render(
            form="phases", stride=s, nphases=len(phases), phases=phases, flip=list(range(2, 2 + nd)),
            full=[qa * sa for qa, sa in zip(q, s)], view6=[v for qa, sa in zip(q, s) for v in (qa, sa)],
            cropped=any(qa * sa != o for qa, sa, o in zip(q, s, out)), crop_slices=", ".join(f":{o}" for o in out),
            **common)


TEMPLATE = ConvTransposeForwardTemplate()
