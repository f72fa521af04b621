"""Persistent recurrent-layer node template (codegen/triton_rnn.py, space/rnn_space.py): LSTM, GRU
and tanh / relu RNN layers run in the Triton interpreter (one program per direction: the
interpreter runs programs one after another, so the grid barrier is trivially met) against
torch's own layer, at tiny sizes."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from kernelwright.analyze.device import H200
from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import node_kernels, triton_rnn
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.codegen.triton_rnn import TEMPLATE
from kernelwright.codegen.triton_scan import TEMPLATE as SCAN
from kernelwright.problem import from_module
from kernelwright.space.rnn_space import RnnShape, programs, rnn_default, rnn_seeds, rnn_space

pytestmark = pytest.mark.interpreter

LAYERS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}


class Rnn(nn.Module):
    """One recurrent layer; `give` passes initial states, `pick` names the returned outputs."""

    def __init__(self, kind, inp, hidden, layers, bidirectional, batch_first, bias, give, pick):
        super().__init__()
        extra = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
        self.rnn = LAYERS[kind](inp, hidden, num_layers=layers, bidirectional=bidirectional,
                                batch_first=batch_first, bias=bias, **extra)
        self.kind, self.give, self.pick = kind, give, pick

    def forward(self, x, *states):
        if not self.give:
            out, hx = self.rnn(x)
        elif self.kind == "lstm":
            out, hx = self.rnn(x, (states[0], states[1]))
        else:
            out, hx = self.rnn(x, states[0])
        h, c = hx if self.kind == "lstm" else (hx, None)
        got = {"output": out, "h_n": h, "c_n": c, "last": out[:, -1] if self.rnn.batch_first else out[-1]}
        return tuple(got[p] for p in self.pick)


def _case(kind, T=4, B=2, I=6, H=16, layers=1, bidirectional=False, batch_first=False, bias=True, give=False,
          pick=("output", "h_n")):
    torch.manual_seed(0)
    model = Rnn(kind, I, H, layers, bidirectional, batch_first, bias, give, pick)
    D = 2 if bidirectional else 1
    x = torch.randn(B, T, I) if batch_first else torch.randn(T, B, I)
    inputs = [x] + ([torch.randn(layers * D, B, H) for _ in range(2 if kind == "lstm" else 1)] if give else [])
    graph = capture(from_module(model, inputs))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    env = run_graph(graph, model, inputs, keep=True)
    return model, inputs, graph, node, env


def _poison(shape, dtype, device, stride=None):
    if stride is None:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device).fill_(float("nan"))


def _run(graph, node, env, cfg, tmp_path, tol=2e-5):
    used = used_outputs(graph, node)
    k = TEMPLATE.render(graph, node, cfg, used)
    assert k.outputs == len(node.outs) and k.inputs == node.inputs
    mod = load_module_from_source(k.source, f"rnn_{node.name}", tmp_path)
    mod._alloc = _poison  # every element of a returned output must be written
    with torch.no_grad():
        res = mod.launch(*[env[v] for v in k.inputs])
    assert isinstance(res, tuple) and len(res) == len(node.outs)
    want = env[node.name]
    for i, (got, ref) in enumerate(zip(res, want)):
        if i in used:
            torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
            # in the library's layout (a batch-first sequence: a transposed time-major buffer), which
            # a reader drawing in memory order (dropout) depends on
            assert got.stride() == ref.stride(), (i, got.stride(), ref.stride())
        else:
            assert got is None, i
    return k, res


CASES = [
    # kind, keyword arguments of _case
    ("lstm", {}),
    ("gru", {}),
    ("rnn_tanh", {}),
    ("rnn_relu", {}),
    ("lstm", dict(layers=2, bidirectional=True, batch_first=True, give=True, pick=("output", "h_n", "c_n"))),
    ("gru", dict(layers=2, bidirectional=True, give=True, H=8, T=5)),
    ("lstm", dict(bias=False, batch_first=True, pick=("c_n",))),
    ("gru", dict(bias=False, layers=2, batch_first=True, pick=("h_n",), H=32, T=3)),
    ("rnn_tanh", dict(bidirectional=True, batch_first=True, give=True, pick=("output",))),
    ("rnn_relu", dict(layers=2, give=True, pick=("h_n",), B=3)),
    ("lstm", dict(layers=2, bidirectional=True, pick=("last",), H=8)),
]


@pytest.mark.parametrize("kind,kw", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={v}" for k, v in v.items()) or "plain")
def test_the_default_config_matches_torch(kind, kw, tmp_path):
    _, _, graph, node, env = _case(kind, **kw)
    assert template_for(graph, node)[0] is TEMPLATE
    cfg = TEMPLATE.default(graph, node)
    assert programs(triton_rnn._Rnn(graph, node).shape(), cfg["BLOCK_H"]) == 1  # the interpreter: one program
    _run(graph, node, env, cfg, tmp_path)


def test_every_interpreter_config_of_a_bidirectional_lstm_matches_torch(tmp_path):
    """Resident and streamed W_hh, any warps: each config of the interpreter's space (P = 1)."""
    _, _, graph, node, env = _case("lstm", H=8, T=3, bidirectional=True, give=True, pick=("output", "h_n", "c_n"))
    configs = TEMPLATE.space(graph, node, H200)
    assert {c["RESIDENT"] for c in configs} == {True, False} and {c["DOT"] for c in configs} == {"fma"}  # H < 16
    for cfg in configs:
        _run(graph, node, env, cfg, tmp_path)


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
def test_dot_matvecs(policy, tmp_path):
    """tl.dot matvecs (batch padded to 16 rows): in IEEE float32 under every policy, on tensor
    cores under tf32 / bf16 only; each stays within its policy's tolerance of torch's layer."""
    _, _, graph, node, env = _case("gru", H=16, T=4, layers=2)
    dot = "ieee" if policy == "fp32" else policy
    configs = [c for c in TEMPLATE.space(graph, node, H200, policy=policy) if c["DOT"] == dot]
    assert configs and all(c["BLOCK_B"] >= 16 and c["BLOCK_H"] >= 16 for c in configs)
    assert TEMPLATE.default(graph, node, H200, policy=policy)["DOT"] == ("fma" if policy == "fp32" else dot)
    assert dot in {c["DOT"] for c in TEMPLATE.seeds(graph, node, H200, policy=policy)}
    for resident in (True, False):
        cfg = next(c for c in configs if c["RESIDENT"] == resident)
        k, _ = _run(graph, node, env, cfg, tmp_path, tol=2e-5 if policy == "fp32" else 1e-2)
        assert f'input_precision="{dot}"' in k.source or (dot == "bf16" and "_bf16_operand(hk)" in k.source)


def test_fp32_never_uses_tensor_cores():
    shape = RnnShape(hidden=1024, batch=64, gates=4, directions=2)
    assert {c["DOT"] for c in rnn_space(shape, spec=H200, precision="fp32")} == {"fma", "ieee"}
    assert "tf32" in {c["DOT"] for c in rnn_space(shape, spec=H200, precision="tf32")}


@pytest.mark.parametrize("sms", [132, 40, 8])
def test_every_program_has_an_sm_of_its_own(sms):
    """P * D never exceeds the device's SM count, nor a wavefront's L * P; W_hh slices kept in
    registers fit half the register file; the default takes the smallest slice (most SMs) that fits."""
    spec = dataclasses.replace(H200, sms=sms)
    for shape in (RnnShape(1024, 64, 3, 1), RnnShape(256, 10, 4, 2), RnnShape(16, 2, 1, 2), RnnShape(256, 10, 4, 1, 6)):
        configs = rnn_space(shape, spec=spec, precision="tf32")
        assert configs
        for c in configs:
            assert programs(shape, c["BLOCK_H"]) * (shape.layers if c.get("WAVE", False) else shape.directions) <= sms
            if c["RESIDENT"]:
                assert shape.gates * c["BLOCK_H"] * 1 << (shape.hidden - 1).bit_length() <= spec.regs_per_sm // 2
        best = rnn_default(shape, spec=spec, precision="fp32")
        assert best["DOT"] == "fma"
        assert best["BLOCK_H"] == min(c["BLOCK_H"] for c in configs if c["DOT"] == best["DOT"])
        seeds = rnn_seeds(shape, spec=spec, precision="tf32")
        assert seeds[0] == rnn_default(shape, spec=spec, precision="tf32") and set(seeds) <= set(configs)


def test_the_interpreter_space_has_one_program_per_direction():
    shape = RnnShape(hidden=32, batch=2, gates=3, directions=2)
    configs = rnn_space(shape, spec=H200, interpreter=True)
    assert configs and all(programs(shape, c["BLOCK_H"]) == 1 for c in configs)
    assert any(programs(shape, c["BLOCK_H"]) > 1 for c in rnn_space(shape, spec=H200))


def test_more_than_one_program_is_never_launched_in_the_interpreter(tmp_path, monkeypatch):
    """A P > 1 config cannot be rendered under the interpreter; a module rendered for a GPU (P > 1)
    refuses to launch there instead of spinning at its first barrier."""
    _, _, graph, node, env = _case("gru", H=32)
    monkeypatch.setattr(triton_rnn, "interpreted", lambda: False)
    wide = next(c for c in TEMPLATE.space(graph, node, H200) if programs(triton_rnn._Rnn(graph, node).shape(),
                                                                          c["BLOCK_H"]) == 4)
    k = TEMPLATE.render(graph, node, wide, used_outputs(graph, node))
    mod = load_module_from_source(k.source, "rnn_wide", tmp_path)
    with pytest.raises(RuntimeError, match="interpreter"), torch.no_grad():
        mod.launch(*[env[v] for v in k.inputs])
    monkeypatch.undo()
    with pytest.raises(ValueError, match="interpreter"):
        TEMPLATE.render(graph, node, wide, used_outputs(graph, node))


def test_unsupported_layers_keep_the_library_call():
    model = nn.LSTM(4, 8, proj_size=4)
    graph = capture(from_module(model, [torch.randn(3, 2, 4)]))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    assert "projections" in TEMPLATE.supports(graph, node, {0})
    model = nn.GRU(4, 8, num_layers=2, dropout=0.5).train()
    graph = capture(from_module(model, [torch.randn(3, 2, 4)]))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    assert "dropout" in TEMPLATE.supports(graph, node, {0})
    model = nn.GRU(4, 8).double()
    graph = capture(from_module(model, [torch.randn(3, 2, 4, dtype=torch.float64)]))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    assert "float32" in TEMPLATE.supports(graph, node, {0})


def test_the_policy_reaches_only_templates_that_take_it():
    assert node_kernels.policy_kwargs(TEMPLATE, "tf32") == {"policy": "tf32"}
    assert node_kernels.policy_kwargs(SCAN, "tf32") == {}


WAVE_CASES = [
    ("gru", dict(layers=2)),
    ("lstm", dict(layers=3, batch_first=True, give=True, pick=("output", "h_n", "c_n"), T=5)),
    ("rnn_tanh", dict(layers=2, bias=False, pick=("h_n",), B=3)),
    ("rnn_relu", dict(layers=3, give=True, pick=("last",), H=8)),
    ("gru", dict(layers=2, batch_first=True, pick=("h_n",), H=32, T=3)),
]


@pytest.mark.parametrize("kind,kw", WAVE_CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={v}" for k, v in v.items()))
def test_a_stack_as_one_wavefront_launch_matches_torch(kind, kw, tmp_path):
    """A unidirectional stack's WAVE configs (every layer in one launch, layer l at step t beside
    layer l + 1 at step t - 1; layers after the first project their input in the kernel), with the
    weights streamed or held in registers (case by case), against torch's layer (in the interpreter one program
    per layer, run in order); under tensor-core policies a streamed wavefront is the second seed,
    under fp32 none is, and the default is never one; a bidirectional or one-layer node has no WAVE
    axis."""
    _, _, graph, node, env = _case(kind, **kw)
    waves = [c for c in TEMPLATE.space(graph, node, H200) if c["WAVE"]]
    assert {c["RESIDENT"] for c in waves} == {True, False}
    assert not any(c["WAVE"] for c in TEMPLATE.seeds(graph, node, H200, policy="fp32"))
    for policy in ("tf32", "bf16"):
        seeds = TEMPLATE.seeds(graph, node, H200, policy=policy)
        if seeds[0]["DOT"] != policy:  # too narrow for tensor cores (H < 16): no wavefront seed either
            assert not any(c["WAVE"] for c in seeds)
            continue
        assert not seeds[0]["WAVE"] and seeds[1]["WAVE"] and not seeds[1]["RESIDENT"] and seeds[1]["DOT"] == policy
        assert seeds[1] in TEMPLATE.space(graph, node, H200, policy=policy)
        assert not TEMPLATE.default(graph, node, H200, policy=policy)["WAVE"]
    resident = WAVE_CASES.index((kind, kw)) % 2 == 1  # (the cases alternate; the dot test runs both)
    for cfg in [next(c for c in waves if c["RESIDENT"] == resident)]:
        k, _ = _run(graph, node, env, cfg, tmp_path)
        assert "_rnn_kernel_wave[" in k.source or "_rnn_kernel_wave," in k.source
    for other in (dict(layers=2, bidirectional=True), dict(layers=1)):
        _, _, g2, n2, _ = _case(kind, **other)
        assert all("WAVE" not in c.as_dict() for c in TEMPLATE.space(g2, n2, H200))


def test_wave_dot_matvecs_match_torch(tmp_path):
    """The wavefront's tl.dot matvecs (IEEE under fp32, tf32 and bf16 under theirs)."""
    _, _, graph, node, env = _case("gru", H=16, T=4, layers=2)
    for policy, dot, tol in (("fp32", "ieee", 2e-5), ("tf32", "tf32", 1e-2), ("bf16", "bf16", 1e-2)):
        for resident in (False, True):
            cfg = next(c for c in TEMPLATE.space(graph, node, H200, policy=policy)
                       if c["WAVE"] and c["DOT"] == dot and c["RESIDENT"] == resident)
            _run(graph, node, env, cfg, tmp_path, tol=tol)
