"""Persistent recurrent-layer kernels compiled on a GPU (skipped without one): the seed configs,
P > 1 programs per direction meeting at the grid barrier every step, against a float64 run of the
recurrent op. (A config whose programs were not all resident would spin forever; the space keeps
D x P within the SM count.)"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph, run_node
from kernelwright.codegen import triton_rnn
from kernelwright.codegen.node_kernels import used_outputs
from kernelwright.codegen.triton_rnn import TEMPLATE
from kernelwright.policy import get_policy
from kernelwright.problem import from_module
from kernelwright.space.rnn_space import programs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or triton_rnn.interpreted(),
                                 reason="needs a CUDA GPU running compiled Triton kernels")]


class Layer(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, hx = self.rnn(x)
        return (out,) + (tuple(hx) if isinstance(hx, tuple) else (hx,))


LAYERS = {
    "lstm-bidirectional-batch_first": lambda: nn.LSTM(32, 256, num_layers=2, bidirectional=True, batch_first=True),
    "gru-2-layers": lambda: nn.GRU(32, 256, num_layers=2),
    "rnn_tanh-no-bias": lambda: nn.RNN(32, 128, bias=False),
}


def _captured(rnn: nn.Module):
    """(graph, its recurrent node, the graph's values, the node's outputs run in float64) of `rnn`
    on the GPU, on an input of 10 sequences of 16 steps."""
    model = Layer(rnn).cuda()
    x = torch.randn((10, 16, 32) if rnn.batch_first else (16, 10, 32), device="cuda")
    graph = capture(from_module(model, [x]))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    with torch.no_grad():
        env = run_graph(graph, model, [x], keep=True)
        ref = run_node(node, {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                              for k, v in env.items()}, torch.device("cuda"))
    return graph, node, env, ref


def _check_configs(graph, node, env, ref, configs, policy: str, tmp_path) -> None:
    """Each config's kernel, built and launched, within the policy's tolerance of the float64 run."""
    pol = get_policy(policy)
    used = used_outputs(graph, node)
    for cfg in configs:
        k = TEMPLATE.render(graph, node, cfg, used)
        mod = load_module_from_source(k.source, f"rnn_gpu_{node.name}", tmp_path)
        with torch.no_grad(), pol.active():
            outs = mod.launch(*[env[v] for v in k.inputs])
            torch.cuda.synchronize()
        for got, want in zip(outs, ref):
            excess = ((got.double() - want).abs() - pol.tol * want.abs()).max().item()
            assert excess <= pol.tol, (cfg, excess)


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_seed_configs_match_float64(name, policy, tmp_path):
    torch.manual_seed(0)
    graph, node, env, ref = _captured(LAYERS[name]())
    seeds = TEMPLATE.seeds(graph, node, policy=policy)
    assert any(programs(triton_rnn._Rnn(graph, node).shape(), c["BLOCK_H"]) > 1 for c in seeds)
    _check_configs(graph, node, env, ref, seeds, policy, tmp_path)


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_wavefront_configs_match_float64(policy, tmp_path):
    """A stack's WAVE configs, several programs per layer and every layer's programs side by side
    (layer l waiting for its own programs' previous step and layer l - 1's same step), against a
    float64 run of the recurrent op."""
    torch.manual_seed(0)
    for rnn in (nn.GRU(32, 256, num_layers=2), nn.LSTM(32, 128, num_layers=3, batch_first=True)):
        graph, node, env, ref = _captured(rnn)
        shape = triton_rnn._Rnn(graph, node).shape()
        waves = [c for c in TEMPLATE.space(graph, node, policy=policy) if c["WAVE"] and programs(shape, c["BLOCK_H"]) > 1]
        assert waves
        _check_configs(graph, node, env, ref, waves[:3], policy, tmp_path)
