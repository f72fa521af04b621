"""The recurrent template's wavefront kernel (a stack's layers side by side, L x P programs)
compiles for sm_90 (no GPU needed) at a real size, with tensor-core (tf32, bf16) and FMA matvecs,
weights streamed and held in registers, and several programs per layer: the interpreter tests run it with one program per layer and never lower it.
The compiling runs in a fresh process, out of the interpreter mode the other tests put Triton in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = r'''
import json, sys, tempfile
import torch
from kernelwright.analyze.device import device_spec
from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.capture import capture
from kernelwright.codegen import triton_rnn
from kernelwright.codegen.node_kernels import used_outputs
from kernelwright.problem import load_problem
from kernelwright.space.rnn_space import programs

rows = []
for path, policy in (("problems/level3/lstm_cn.py", "tf32"), ("problems/level3/gru.py", "bf16")):
    graph = capture(load_problem(path))
    node = next(n for n in graph.nodes if n.target in triton_rnn.KINDS)
    shape = triton_rnn._Rnn(graph, node).shape()
    space = triton_rnn.TEMPLATE.space(graph, node, device_spec("H100"), policy=policy)
    waves = [c for c in space if c["WAVE"] and programs(shape, c["BLOCK_H"]) > 1]
    kinds = {(c["DOT"], c["RESIDENT"]) for c in waves}
    for dot, resident in sorted(kinds & {("tf32", False), ("tf32", True), ("fma", False), ("bf16", False)}):
        cfg = min((c for c in waves if (c["DOT"], c["RESIDENT"]) == (dot, resident)),
                  key=lambda c: c["BLOCK_H"])  # the most programs
        k = triton_rnn.TEMPLATE.render(graph, node, cfg, used_outputs(graph, node))
        args = [meta_tensor(graph.meta(v).shape, graph.meta(v).stride, getattr(torch, graph.meta(v).dtype))
                for v in k.inputs]
        with tempfile.TemporaryDirectory() as d:
            builds = compile_source_for_target(k.source, "unit", args, d)
        rows.append({"case": f"{path}:{policy}:{dot}:{'resident' if resident else 'streamed'}", "programs": shape.layers * programs(shape, cfg["BLOCK_H"]),
                     "builds": [[b.kernel, b.error] for b in builds]})
json.dump(rows, open(sys.argv[1], "w"))
'''


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("rnn_sm90") / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", WORKER, str(out)], env=env, cwd=root, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_wavefront_kernel_compiles_for_sm90_with_every_matvec(rows):
    cases = {r["case"] for r in rows}
    for dot in ("fma", "tf32"):
        assert f"problems/level3/lstm_cn.py:tf32:{dot}:streamed" in cases
    assert "problems/level3/lstm_cn.py:tf32:tf32:resident" in cases  # W_hh and W_ih slices in registers
    assert "problems/level3/gru.py:bf16:bf16:streamed" in cases
    for r in rows:
        assert r["programs"] > 6  # several programs per layer, every layer's side by side
        assert r["builds"] and all(kernel.endswith("_wave") and error is None for kernel, error in r["builds"]), r
