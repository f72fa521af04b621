"""The attention template (codegen/triton_attention.py) on a GPU against the by-hand path and
PyTorch's SDPA, per shape, mask and policy: each implementation's excess over the float64 result
(verify.compare's measure, against the policy's tolerance) and its device time (measure.timer: L2
flushed, interleaved rounds, medians).

usage: PYTHONPATH=src python3 scripts/attention_check.py OUT.jsonl [--policies fp32,tf32,bf16]
       [--shapes B,H,S,D ...] [--masks none,causal]

Implementations, q, k, v of [B, H, S, D] (bf16 tensors under bf16, as the policy's casts make them):
  by_hand   bmm(q, kᵀ) · scale, the mask applied with masked_fill(-inf), softmax, bmm with v, in eager
            under the policy (TF32 bmms under tf32)
  compile   torch.compile of by_hand
  sdpa      F.scaled_dot_product_attention (a causal mask as is_causal=True)
  triton    the template's seed configs, each checked, the fastest named in "best"
A causal mask reaches the template as the boolean lower-triangular tensor, the form plan/attention.py
gives a registered mask (its blocks past the diagonal skipped on the device). One JSON line per
(shape, mask, policy), written as soon as it is measured; the decision it informs: whether by-hand
attention without a weight-only mask should become one SDPA node under tf32 too (plan/attention.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen.node_kernels import seeds, used_outputs
from kernelwright.codegen.triton_attention import SDPA, TEMPLATE
from kernelwright.measure.timer import time_interleaved
from kernelwright.policy import get_policy
from kernelwright.problem import from_module
from kernelwright.verify.compare import excess

SHAPES = ["16,12,1024,64", "128,8,512,96", "64,12,197,64", "4,32,2048,128"]


class _Sdpa(nn.Module):
    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def by_hand(q, k, v, mask):
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def check(out, shape: tuple, masked: str, policy_name: str, tmp: str) -> dict:
    b, h, s, d = shape
    policy = get_policy(policy_name)
    dtype = torch.bfloat16 if policy_name == "bf16" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    mask = torch.ones(s, s, dtype=torch.bool, device="cuda").tril() if masked == "causal" else None
    ref = by_hand(q.double(), k.double(), v.double(), mask)
    args = [q, k, v] + ([mask] if mask is not None else [])
    graph = capture(from_module(_Sdpa(), [a.cpu() for a in args]))
    node = next(n for n in graph.nodes if n.target == SDPA)
    compiled = torch.compile(by_hand)
    fns = {"by_hand": lambda: by_hand(q, k, v, mask), "compile": lambda: compiled(q, k, v, mask),
           "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None)}
    row: dict = {"shape": list(shape), "mask": masked, "policy": policy_name, "excess": {}, "configs": {}}
    with torch.no_grad(), policy.active():
        for i, cfg in enumerate(seeds(TEMPLATE, graph, node, policy=policy_name)):
            src = TEMPLATE.render(graph, node, cfg.as_dict(), used_outputs(graph, node)).source
            mod = load_module_from_source(src, f"attention_{policy_name}_{masked}_{'x'.join(map(str, shape))}_{i}", tmp)
            name = f"triton[{cfg.key()}]"
            fns[name] = (lambda m: lambda: m.launch(*args)[0])(mod)
            row["configs"][name] = cfg.as_dict()
        for name, fn in list(fns.items()):
            try:
                row["excess"][name] = excess(fn(), ref, policy.tol)
            except Exception as e:  # noqa: BLE001 - a failing implementation is a result
                row["excess"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                del fns[name]
        fns = {n: f for n, f in fns.items() if isinstance(row["excess"][n], float) and row["excess"][n] <= policy.tol}
        times = time_interleaved(fns, min_runs=50, budget_s=4.0, device_only=True)
    row["ms"] = {n: t.median_ms for n, t in times.items()}
    ours = {n: t for n, t in row["ms"].items() if n.startswith("triton")}
    if ours:
        row["best"] = min(ours, key=ours.get)
    row["gpu"], row["torch"] = torch.cuda.get_device_name(), torch.__version__
    out.write(json.dumps(row) + "\n")
    out.flush()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--policies", default="fp32,tf32,bf16")
    ap.add_argument("--shapes", nargs="*", default=SHAPES, help="B,H,S,D")
    ap.add_argument("--masks", default="none,causal")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("attention_check: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes]
        if any(len(s) != 4 for s in shapes):
            raise ValueError
    except ValueError:
        print("attention_check: --shapes takes B,H,S,D words", file=sys.stderr)
        return 2
    with open(a.out, "a") as out, tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            for masked in a.masks.split(","):
                for policy in a.policies.split(","):
                    row = check(out, shape, masked, policy, tmp)
                    fast = {n: round(t, 3) for n, t in sorted(row["ms"].items(), key=lambda kv: kv[1])}
                    print(shape, masked, policy, fast, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
