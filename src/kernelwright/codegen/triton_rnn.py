"""Persistent Triton kernels for recurrent layers (`aten.lstm.input`, `aten.gru.input`,
`aten.rnn_tanh.input`, `aten.rnn_relu.input`) as a node template, rendered from
templates/triton/rnn.py.j2.

The captured node is a whole `nn.LSTM` / `nn.GRU` / `nn.RNN`: any number of layers, one or two
directions, batch-first or time-major, with or without biases, initial states given or zeros
(capture makes the zeros a value of their own), and any of its outputs read. Per layer and
direction the input projections of all T steps are one GEMM (`torch.addmm` over the whole
sequence, into a [D, T*B, G*H] buffer); the recurrence of the layer is then one persistent kernel
launch (see the template's header and space/rnn_space.py for the schedule and its axes). Layers
after the first read the previous layer's output through the same GEMM.

Not supported (the library call stays): packed sequences (the `.data` overloads), LSTM
projections (`proj_size`), dropout between layers in training, dtypes other than float32.
"""
from __future__ import annotations

import os

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.capture.graph import Graph, OpNode, Ref
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.node_kernels import NodeKernel
from kernelwright.codegen.templating import triton_template
from kernelwright.space.config import Config
from kernelwright.space.rnn_space import NAME, RnnShape, next_pow2, programs, rnn_default, rnn_seeds, rnn_space

KINDS = {"aten.lstm.input": "lstm", "aten.gru.input": "gru", "aten.rnn_tanh.input": "rnn_tanh",
         "aten.rnn_relu.input": "rnn_relu"}
GATES = {"lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n"), "rnn_tanh": ("h",), "rnn_relu": ("h",)}
OUTPUTS = {"lstm": ("output", "h_n", "c_n"), "gru": ("output", "h_n"), "rnn_tanh": ("output", "h_n"),
           "rnn_relu": ("output", "h_n")}
_INT32 = 2**31


def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (programs one after another)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _contiguous(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= int(n)
    return tuple(reversed(out))


class _Rnn:
    """The arguments of one recurrent node: (input, hx, params, has_biases, num_layers, dropout,
    train, bidirectional, batch_first); hx is a list [h0, c0] for an LSTM, one value otherwise."""

    def __init__(self, graph: Graph, node: OpNode):
        self.kind = KINDS[node.target]
        self.G = len(GATES[self.kind])
        a = node.args
        if len(a) != 9:
            raise ValueError(f"expected 9 arguments, got {len(a)}")
        x, hx, params, bias, layers, dropout, train, bidir, batch_first = a
        if not isinstance(x, Ref):
            raise ValueError("the input is not a tensor value")
        states = list(hx) if self.kind == "lstm" else [hx]
        if len(states) != (2 if self.kind == "lstm" else 1) or not all(isinstance(s, Ref) for s in states):
            raise ValueError("the initial states are not tensor values")
        if not all(isinstance(p, Ref) for p in params):
            raise ValueError("a weight is not a tensor value")
        self.x, self.states, self.params = x.name, [s.name for s in states], [p.name for p in params]
        self.bias, self.layers, self.dropout, self.train = bool(bias), int(layers), float(dropout), bool(train)
        self.D = 2 if bidir else 1
        self.batch_first = bool(batch_first)
        xm = graph.meta(self.x)
        self.xmeta = xm
        if xm is None or len(xm.shape) != 3:
            raise ValueError("the input is not a 3-D tensor (packed or unbatched sequences)")
        if self.batch_first:
            self.B, self.T, self.I = xm.shape
        else:
            self.T, self.B, self.I = xm.shape
        hm = graph.meta(self.states[0])
        if hm is None or len(hm.shape) != 3:
            raise ValueError("the initial hidden state is not a 3-D tensor")
        self.H = int(hm.shape[2])
        self.state_shape = (self.layers * self.D, self.B, self.H)
        self.per_dir = 4 if self.bias else 2
        self.out_shape = (self.B, self.T, self.D * self.H) if self.batch_first else (self.T, self.B, self.D * self.H)

    def param_shapes(self) -> list[tuple[int, ...]]:
        """The shape each weight must have, in ATen's order (per layer, per direction: W_ih, W_hh,
        then b_ih, b_hh with biases)."""
        gh, out = self.G * self.H, []
        for layer in range(self.layers):
            inp = self.I if layer == 0 else self.D * self.H
            for _ in range(self.D):
                out += [(gh, inp), (gh, self.H)] + ([(gh,), (gh,)] if self.bias else [])
        return out

    def check(self, graph: Graph) -> str | None:
        if self.xmeta.dtype != "float32":
            return f"input dtype {self.xmeta.dtype} (only float32 is supported)"
        if min(self.T, self.B, self.I, self.H) < 1:
            return "empty sequence, batch or feature dim"
        want = self.param_shapes()
        if len(self.params) != len(want):
            return f"{len(self.params)} weights, expected {len(want)} (LSTM projections are not supported)"
        for s in self.states:
            m = graph.meta(s)
            if m is None or tuple(m.shape) != self.state_shape or m.dtype != "float32":
                return f"initial state {s} is not float32{list(self.state_shape)}"
        for name, shape in zip(self.params, want):
            m = graph.meta(name)
            if m is None or tuple(m.shape) != shape or m.dtype != "float32":
                return f"weight {name} is not float32{list(shape)}"
        if self.dropout > 0 and self.train and self.layers > 1:
            return "dropout between layers in training"
        gi = self.D * self.T * self.B * self.G * self.H
        if max(gi, self.T * self.B * self.D * self.H, self.T * self.B * self.I) >= _INT32:
            return "tensors too large for the kernel's int32 offsets"
        return None

    def shape(self) -> RnnShape:
        return RnnShape(hidden=self.H, batch=self.B, gates=self.G, directions=self.D, layers=self.layers)


def _matvec(dot: str):
    def render(h: str, w: str) -> str:
        if dot in ("tf32", "ieee"):
            return f'tl.dot({h}, {w}, input_precision="{dot}")'
        if dot == "bf16":
            return f"tl.dot({h}, {w})"
        return f"tl.sum({h}[:, None, :] * {w}[None, :, :], axis=2)"
    return render


class RnnTemplate:
    """Node template for whole recurrent layers (LSTM, GRU, tanh / relu RNN) on float32 tensors."""

    name = NAME
    by_policy = True  # tensor-core matvecs under tf32 / bf16 only (node_kernels.policy_kwargs)

    def supports(self, graph: Graph, node: OpNode, used: set[int]) -> str | None:
        if node.target not in KINDS:
            return f"{node.target} is not a recurrent layer (lstm/gru/rnn .input)"
        try:
            rnn = _Rnn(graph, node)
        except (ValueError, TypeError) as e:
            return str(e)
        why = rnn.check(graph)
        if why is not None:
            return why
        if not used:
            return "no output is read"
        if not rnn_space(rnn.shape(), spec=device_spec(), interpreter=interpreted()):
            return "no config fits the device"
        return None

    def _args(self, spec: DeviceSpec | None, policy: str | None):
        return dict(spec=spec or device_spec(), precision=policy or "fp32", interpreter=interpreted())

    def space(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> list[Config]:
        return rnn_space(_Rnn(graph, node).shape(), **self._args(spec, policy))

    def default(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> Config:
        return rnn_default(_Rnn(graph, node).shape(), **self._args(spec, policy))

    def seeds(self, graph: Graph, node: OpNode, spec: DeviceSpec | None = None, policy: str | None = None) -> list[Config]:
        return rnn_seeds(_Rnn(graph, node).shape(), **self._args(spec, policy))

    def render(self, graph: Graph, node: OpNode, config: dict, used: set[int]) -> NodeKernel:
        why = self.supports(graph, node, used)
        if why is not None:
            raise ValueError(f"{NAME} cannot render {node.name}: {why}")
        cfg = dict(config.as_dict() if isinstance(config, Config) else config)
        r = _Rnn(graph, node)
        block_h = int(cfg["BLOCK_H"])
        P = programs(r.shape(), block_h)
        if P > 1 and interpreted():
            raise ValueError(f"{NAME}: P={P} programs per direction cannot run in the Triton interpreter")
        dot = str(cfg.get("DOT", "fma"))
        inputs = node.inputs
        names = OUTPUTS[r.kind]
        used_names = {names[i] for i in used if i < len(names)}
        bt = r.batch_first
        DH, GH = r.D * r.H, r.G * r.H
        ctx = dict(
            kind=r.kind, node=node.name, target=node.target, kernel=f"{_ident(node.name)}_rnn_kernel",
            layers=r.layers, D=r.D, T=r.T, B=r.B, I=r.I, H=r.H, G=r.G, HP=next_pow2(r.H), P=P,
            gates=list(GATES[r.kind]), bias=r.bias, batch_first=bt, per_dir=r.per_dir,
            resident=bool(cfg["RESIDENT"]), wave=bool(cfg.get("WAVE", False)), dot="" if dot == "fma" else dot,
            matvec=_matvec(dot),
            dot_text={"fma": "broadcast multiply and sum in exact float32",
                      "ieee": "tl.dot in IEEE float32 (per-thread FMA tiles)",
                      "tf32": "tl.dot with tf32 operands, float32 accumulation",
                      "bf16": "tl.dot with bf16 operands, float32 accumulation"}[dot],
            BLOCK_H=block_h, BLOCK_B=int(cfg["BLOCK_B"]), BLOCK_K=int(cfg["BLOCK_K"]), num_warps=int(cfg["num_warps"]),
            x=r.x, x_at=inputs.index(r.x), x_shape=tuple(r.xmeta.shape), x_stride=_contiguous(r.xmeta.shape),
            h0=r.states[0], h0_at=inputs.index(r.states[0]),
            c0=r.states[-1], c0_at=inputs.index(r.states[-1]),
            state_shape=r.state_shape, state_stride=_contiguous(r.state_shape),
            params=[(inputs.index(n), s, _contiguous(s), n) for n, s in zip(r.params, r.param_shapes())],
            out_shape=r.out_shape, out_used="output" in used_names, hn_used="h_n" in used_names,
            cn_used="c_n" in used_names,
            outs=list(names), returns=[{"output": "out", "h_n": "hn", "c_n": "cn"}[n] if n in used_names else "None"
                                       for n in names],
            gi_st_t=GH if bt else r.B * GH, gi_st_b=r.T * GH if bt else GH,
            out_st_t=DH if bt else r.B * DH, out_st_b=r.T * DH if bt else DH,
            out_stride=_recorded_stride(node, r.out_shape),
        )
        text = triton_template("rnn.py.j2").render(**ctx)
        return NodeKernel(with_helpers(text), list(inputs), len(node.outs))


def _recorded_stride(node: OpNode, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides the library gives the output sequence where they are not contiguous (a
    batch-first sequence comes back as a transposed time-major buffer), else None: the kernel's
    result is copied into them, so every reader (a dropout drawing its mask in memory order
    included) sees the layout it was planned and verified with."""
    meta = node.outs[0] if node.outs else None
    if meta is None or tuple(meta.shape) != tuple(shape) or meta.stride is None:
        return None
    stride = tuple(int(s) for s in meta.stride)
    return None if stride == _contiguous(shape) else stride


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out if out and not out[0].isdigit() else "n_" + out


TEMPLATE = RnnTemplate()

__all__ = ["GATES", "KINDS", "TEMPLATE", "RnnTemplate", "interpreted"]
