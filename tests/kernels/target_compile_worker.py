"""Worker for test_target_compile.py, run in a fresh process without TRITON_INTERPRET (Triton
modules imported in interpreter mode cannot compile later): compiles the first candidates of the
given problems for sm_90 and writes {case: {"failures": [lines], "compiled": n, "covered": m,
"features": [the features of its candidates]}} as JSON.

With --new-features, a candidate is compiled only when it has a feature (see `features`) that no
candidate compiled before it in this run had; the others are counted as covered. Without it every
candidate is compiled.

usage: python tests/kernels/target_compile_worker.py OUT.json [--new-features] PROBLEM.py:POLICY ...
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import torch

from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.capture import capture
from kernelwright.codegen import gemm_epilogue, pool_chain
from kernelwright.codegen.triton_pool import TEMPLATE as POOL
from kernelwright.codegen.node_kernels import seeds, template_for, used_outputs
from kernelwright.codegen.triton_group import Unsupported, extent, lower, render_group, tiled_apply_dims, transposed_walk
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import load_problem
from kernelwright.search.units import fused_gemm_space
from kernelwright.space.group_space import seed_configs, tiled_default

SPLIT = dict(BLOCK_M=1, BLOCK_R=1024, SPLIT=64, num_warps=4, num_stages=1, one_pass=False)


def _args(graph, names):
    return [meta_tensor(graph.meta(v).shape, graph.meta(v).stride, getattr(torch, graph.meta(v).dtype)) for v in names]


def gemm_candidates(graph, plan, policy):
    """(label, kind, config, module text, input names) of each fused GEMM's first config without
    TMA (its descriptors need real device pointers): GEMM + epilogue and GEMM + row reduction."""
    for unit in plan.units:
        gemm = graph.node(unit.node) if unit.node is not None else None
        if gemm is None or gemm.target not in gemm_epilogue.GEMMS:
            continue
        users = {u.name for u in graph.users(gemm.name)}
        group = next((g for g in plan.groups if users and users <= set(g.nodes)), None)
        if group is None or gemm_epilogue.fusable(graph, gemm, group):
            continue
        try:
            fused = gemm_epilogue.build(graph, gemm, group, plan.groups)
        except Unsupported:
            continue
        cfg = next(c for c in fused_gemm_space(graph, fused, policy) if not c.get("TMA"))
        text, ins = gemm_epilogue.render(fused, cfg.as_dict(), policy)
        yield f"{group.id}+{gemm.name} {cfg}", "fused gemm", cfg.as_dict(), text, ins


def candidates(graph, plan, policy=None):
    """(label, kind, config, module text, input names) of the first candidates of every unit."""
    for unit in plan.units:
        if unit.group is not None:
            grp = unit.group
            try:
                low = lower(graph, grp)
            except Unsupported:  # left to the library
                continue
            M, R, contig = extent(low)
            configs = [c.as_dict() for c in seed_configs(M, R, grp.rdims is None, contig)[:3]]
            if grp.rdims is None and transposed_walk(low) is not None:
                configs.insert(0, tiled_default().as_dict())
            if grp.rdims is not None:
                configs.append(SPLIT)
                if tiled_apply_dims(low):
                    configs.append(dict(SPLIT, BLOCK_R=2048, TILED_APPLY=True))
            for cfg in configs:
                try:
                    k = render_group(graph, grp, cfg, low)
                except Unsupported:
                    continue
                yield f"{grp.id} {cfg}", "group", cfg, k.source, k.inputs
        else:
            node = graph.node(unit.node)
            template, _ = template_for(graph, node)
            if template is None or not template.name.startswith("triton"):
                continue  # library, or a torch layout variant: nothing to compile
            # the configs the search times first (the depthwise row-streaming kernel's too; the
            # policy's, for templates whose configs depend on it)
            for cfg in seeds(template, graph, node, policy=policy):
                k = template.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
                yield f"{node.name} {template.name} {cfg.as_dict()}", template.name, cfg.as_dict(), k.source, k.inputs


def chain_candidates(graph, plan):
    """(label, kind, config, module text, input names) of each pool chain's default config."""
    for chain in plan.chains:
        try:
            kernel = pool_chain.build(graph, chain)
        except Unsupported:
            continue
        cfg = POOL.default(graph, graph.node(chain.pool)).as_dict()
        text, ins = pool_chain.render(kernel, cfg, "unit")
        yield f"{chain.name} {cfg}", "pool chain", cfg, text, ins


def features(kind: str, cfg: dict, text: str, policy: str) -> set:
    """What decides how a candidate compiles, apart from its sizes: the kernel family with its
    config's flags and tile classes (1 or more; warps and stages left out) and the dtypes its code
    names (the policy too where a `tl.dot` lowers under it), each device function it calls, the
    row-streaming depthwise kernel's shape (its taps are unrolled), and 64-bit offsets."""
    kind = re.sub(r"\[.*", "", kind)  # a node template's name carries its default config
    if kind == "group":
        m = re.search(r"Generated by kernelwright: (.*?) for group", text)
        kind = m.group(1) if m else "group"
    flags = tuple(sorted((k, v if isinstance(v, bool) else "1" if v == 1 else "n" if isinstance(v, int) else str(v))
                         for k, v in cfg.items() if k not in ("num_warps", "num_stages")))
    dtypes = tuple(sorted(set(re.findall(r"tl\.(bfloat16|float16|float64|int64|int16|int8|uint8|int1)\b", text))))
    out = {("kernel", kind, flags, dtypes, policy if "tl.dot(" in text else "")}
    out |= {("call", f) for f in re.findall(r"\b(?:tl|libdevice|math)\.(\w+)\(", text)}
    out |= {("helper", f) for f in re.findall(r"\b(kw_\w+)\(", text)}
    out |= {("rows", m) for m in re.findall(r"for (\d+ x \d+) kernels at row stride", text)}
    if ".to(tl.int64)" in text:
        out.add(("int64", kind))
    return out


def check(path: str, policy: str, cache: Path, seen: set | None = None) -> dict:
    """Compile the first candidates of `path` under `policy`: all of them, or (`seen` given) those
    with a feature not in `seen`, which then holds their features too."""
    graph, _ = rewrite(capture(load_problem(path)), policy)
    plan = plan_graph(graph)
    failures, compiled, covered, held = [], 0, 0, set()
    for label, kind, cfg, text, inputs in [*candidates(graph, plan, policy), *gemm_candidates(graph, plan, policy),
                                              *chain_candidates(graph, plan)]:
        feats = features(kind, cfg, text, policy)
        held |= feats
        if seen is not None:
            new = feats - seen
            if not new:
                covered += 1
                continue
            seen |= new
        compiled += 1
        builds = compile_source_for_target(text, "unit", _args(graph, inputs), cache)
        if not builds:
            failures.append(f"{label}: the launcher launched no kernel")
        failures += [f"{label} {b.kernel}: {b.error}" for b in builds if b.error]
    return dict(failures=failures, compiled=compiled, covered=covered, features=sorted(map(repr, held)))


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    out, cases = sys.argv[1], sys.argv[2:]
    seen = None
    if cases and cases[0] == "--new-features":
        seen, cases = set(), cases[1:]
    cache = Path(tempfile.mkdtemp(prefix="kw_sm90_"))
    results = {}
    for case in cases:
        path, policy = case.rsplit(":", 1)
        try:
            results[case] = check(path, policy, cache, seen)
        except Exception as e:  # noqa: BLE001 - reported per case
            results[case] = dict(failures=[f"worker error: {type(e).__name__}: {e}"], compiled=0, covered=0,
                                 features=[])
    Path(out).write_text(json.dumps(results))
