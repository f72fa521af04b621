"""Every Triton kernel optimize would try first for a shipped problem compiles for sm_90.

The interpreter tests never lower a kernel; this compiles them (front end to cubin, no GPU) at the
problems' real sizes: each fusion group with its first three seeds (default, long-chunk streaming,
default with eviction hints) and a split-reduction variant, and each node template with its default config.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.capture import capture
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.codegen.triton_group import Unsupported, extent, lower, render_group
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import load_problem
from kernelwright.space.group_space import seed_configs

ROOT = Path(__file__).resolve().parent.parent / "problems"
PROBLEMS = sorted(p for p in ROOT.glob("level*/*.py") if p.stem not in ("lstm", "gru"))  # unrolled RNNs: slow
SPLIT = dict(BLOCK_M=1, BLOCK_R=1024, SPLIT=64, num_warps=4, num_stages=1, one_pass=False)


def _args(graph, names):
    return [meta_tensor(graph.meta(v).shape, graph.meta(v).stride, getattr(torch, graph.meta(v).dtype)) for v in names]


def _candidates(graph, plan):
    """(label, module text, input names) of the first candidates of every unit."""
    for unit in plan.units:
        if unit.group is not None:
            grp = unit.group
            try:
                low = lower(graph, grp)
            except Unsupported:  # left to the library
                continue
            M, R, contig = extent(low)
            configs = [c.as_dict() for c in seed_configs(M, R, grp.rdims is None, contig)[:3]]
            if grp.rdims is not None:
                configs.append(SPLIT)
            for cfg in configs:
                try:
                    k = render_group(graph, grp, cfg, low)
                except Unsupported:
                    continue
                yield f"{grp.id} {cfg}", k.source, k.inputs
        else:
            node = graph.node(unit.node)
            template, _ = template_for(graph, node)
            if template is None or not template.name.startswith("triton"):
                continue  # library, or a torch layout variant: nothing to compile
            k = template.render(graph, node, template.default(graph, node).as_dict(), used_outputs(graph, node))
            yield f"{node.name} {template.name}", k.source, k.inputs


CONV = [p for p in PROBLEMS if any(k in p.stem for k in ("conv", "cnn", "resnet"))]
CASES = [(p, "fp32") for p in PROBLEMS] + [(p, "tf32") for p in CONV]  # tf32: channels-last convolutions


@pytest.mark.parametrize("path,policy", CASES, ids=lambda v: f"{v.parent.name}/{v.stem}" if isinstance(v, Path) else v)
def test_first_candidates_compile_for_sm90(path, policy, tmp_path):
    graph, _ = rewrite(capture(load_problem(path)), policy)
    plan = plan_graph(graph)
    failures = []
    for label, text, inputs in _candidates(graph, plan):
        builds = compile_source_for_target(text, "unit", _args(graph, inputs), tmp_path)
        assert builds, f"{label}: the launcher launched no kernel"
        failures += [f"{label} {b.kernel}: {b.error}" for b in builds if b.error]
    assert not failures, "\n".join(failures)
