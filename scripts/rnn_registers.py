"""Registers and spills of the persistent RNN kernel's configs (codegen/triton_rnn.py), without a GPU:
each config of a problem's recurrent layer rendered, compiled for sm_90 and passed through
`ptxas -v` (build/triton_target.py, `resources=True`). A config that spills keeps part of its
matvec in local memory, which its time on a GPU pays for.

usage: PYTHONPATH=src python3 scripts/rnn_registers.py PROBLEM.py [--policy fp32] [--where SEL] [--device H100]

--where: the configs whose axes take the listed values (AXIS=V[:V...],..., e.g.
`WAVE=1,BLOCK_H=16:32`; 1 / 0 for true / false), default every config of the space for --device
(a name `analyze.device.device_spec` knows). One line per config: its axes, then per kernel
launched: name, registers per thread, bytes of spill stores per thread, shared memory in bytes.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from kernelwright.analyze.device import device_spec
from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.capture import capture
from kernelwright.codegen import triton_rnn
from kernelwright.codegen.node_kernels import used_outputs
from kernelwright.errors import UserError
from kernelwright.problem import load_problem
from kernelwright.space.axes import parse_selection, selected

AXES = ("DOT", "RESIDENT", "WAVE", "BLOCK_H", "BLOCK_B", "BLOCK_K", "num_warps")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", help="a problem file (KernelBench format) with one recurrent layer")
    ap.add_argument("--policy", default="fp32", choices=("fp32", "tf32", "bf16"))
    ap.add_argument("--where", default=None, metavar="SEL", help="AXIS=V[:V...],...: only these configs")
    ap.add_argument("--device", default="H100", help="the device whose SM count bounds the space")
    args = ap.parse_args(argv)
    try:
        where = parse_selection(args.where) if args.where else {}
    except ValueError as e:
        raise UserError(f"--where: {e}") from None
    graph = capture(load_problem(args.problem))
    node = next((n for n in graph.nodes if n.target in triton_rnn.KINDS), None)
    if node is None:
        raise UserError(f"{args.problem}: no recurrent layer (LSTM / GRU / RNN) in the captured graph")
    space = triton_rnn.TEMPLATE.space(graph, node, device_spec(args.device), policy=args.policy)
    picked = [c for c in space if selected(c, where)]
    print(f"{len(space)} configs, {len(picked)} selected", flush=True)
    used = used_outputs(graph, node)
    for cfg in picked:
        k = triton_rnn.TEMPLATE.render(graph, node, cfg, used)
        metas = [graph.meta(v) for v in k.inputs]
        ins = [meta_tensor(m.shape, m.stride, getattr(torch, m.dtype)) for m in metas]
        with tempfile.TemporaryDirectory() as d:
            builds = compile_source_for_target(k.source, "unit", ins, d, resources=True)
        kernels = {(b.kernel, b.error, b.registers, b.spill_bytes, b.shared_bytes) for b in builds
                   if "rnn" in b.kernel}  # (the input projections' GEMMs are not the template's)
        print({a: cfg[a] for a in AXES if a in cfg}, sorted(kernels, key=str), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"rnn_registers.py: {e}", file=sys.stderr)
        sys.exit(2)
