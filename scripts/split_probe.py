"""Dev tool (GPU): time a split-reduction group over a grid of configs, beyond the search space.

Plans PROBLEM under POLICY and, for every group that takes "triton.split" configs, times the whole
launch (partial + finish + apply) for the grid below (num_stages 1-3 included), printing the best
ten and the default. Used to find why the BN statistics pass runs at half of torch.compile's speed.

usage: PYTHONPATH=src python3 scripts/split_probe.py PROBLEM.py [--precision tf32] [--top 10]
"""
import argparse
import itertools
import tempfile
from pathlib import Path

import torch

from kernelwright.capture.execute import run_graph
from kernelwright.capture.export import capture
from kernelwright.plan.fusion import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem
from kernelwright.search.units import GroupTuner
from kernelwright.space.config import Config

ap = argparse.ArgumentParser()
ap.add_argument("problem")
ap.add_argument("--precision", default="tf32")
ap.add_argument("--top", type=int, default=10)
ap.add_argument("--groups", default="")
ap.add_argument("--block-m", default="16,32,64,128")
ap.add_argument("--split", default="128,256,512,1024")
args = ap.parse_args()

prob, policy = load_problem(args.problem), get_policy(args.precision)
graph, _ = rewrite(capture(prob), policy.name)
plan = plan_graph(graph)
with torch.no_grad(), policy.active():
    env = run_graph(graph, prob.make_model("cuda"), prob.make_inputs(0, "cuda"), keep=True)
cache = Path(tempfile.mkdtemp())
for group in plan.groups:
    if group.rdims is None or (args.groups and group.id not in args.groups.split(",")):
        continue
    t = GroupTuner(graph, group, env, policy, torch.device("cuda"), cache, True)
    if not any(c.template == "triton.split" for c in t.space):
        continue
    base = [c for c in t.space if c.template == "triton.split"]
    extra = {k: v for k, v in t.default.as_dict().items()  # e.g. TILED_APPLY, kept as the default has it
             if k not in ("BLOCK_M", "BLOCK_R", "SPLIT", "one_pass", "num_warps", "num_stages")}
    grid = [Config.make("triton.split", BLOCK_M=bm, BLOCK_R=br, SPLIT=sp, one_pass=False, num_warps=nw, num_stages=ns,
                        **extra)
            for bm, br, sp, nw, ns in itertools.product([int(v) for v in args.block_m.split(",")], [16, 32, 64, 128],
                                                        [int(v) for v in args.split.split(",")], [4, 8], [1, 3])
            if 1024 <= bm * br <= 8192 and bm <= t.M]
    res = []
    for k in range(0, len(grid), 64):
        res += t.run(grid[k:k + 64])
    ok = sorted((r for r in res if r.ok), key=lambda r: r.time_ms)
    print(f"{group.id} M={t.M} R={t.R} ops={'+'.join(graph.node(n).op for n in group.nodes)}: {len(ok)}/{len(res)} ok, "
          f"library {t.library_ms:.4f} ms; in-space configs {len(base)}")
    for r in ok[:args.top]:
        print(f"  {r.time_ms:.4f} ms  {r.config.key()}")
    dflt = [r for r in res if r.config.key() == t.default.key()]
    print("  default:", t.default.key(), dflt[0].time_ms if dflt else "(not in grid)")
