"""Dev tool (GPU): scaled_dot_product_attention against matmul / softmax / matmul, per policy.

For the transformer_block shapes (q, k, v as head views of one [b, s, 3d] projection), prints for
fp32 (TF32 off), tf32 and bf16: the error of each path against a float64 reference, the median
time, the output strides and the kernels SDPA launches. Decides which policies the attention
rewrite (plan.rewrites.attention) may apply under at matched precision.

With --causal: scores masked by a lower-triangular mask (-inf above the diagonal), and SDPA
both with that boolean attn_mask (what the rewrite emits) and with is_causal=True.

usage: PYTHONPATH=src python3 scripts/attention_probe.py [--b 8 --s 1024 --h 16 --d 1024] [--causal]
"""
import argparse
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernelwright.policy import get_policy

ap = argparse.ArgumentParser()
for k, v in (("b", 8), ("s", 1024), ("h", 16), ("d", 1024)):
    ap.add_argument(f"--{k}", type=int, default=v)
ap.add_argument("--causal", action="store_true")
a = ap.parse_args()
b, s, h, d = a.b, a.s, a.h, a.d
dh = d // h
torch.manual_seed(0)
qkv = torch.randn(b, s, 3 * d, device="cuda")
q, k, v = (t.reshape(b, s, h, dh).transpose(1, 2) for t in qkv.split(d, dim=-1))
keep = torch.ones(s, s, dtype=torch.bool, device="cuda").tril() if a.causal else None


def by_hand(q, k, v):
    att = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
    if keep is not None:
        att = att.masked_fill(~keep, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=1 / math.sqrt(dh))


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(dh))


ref = by_hand(q.double(), k.double(), v.double())


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:70] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


print(f"b={b} s={s} h={h} dh={dh}; q strides {q.stride()}")
print("| policy | path | max abs err vs fp64 | ms | out strides | kernels |\n|---|---|---:|---:|---|---|")
for name in ("fp32", "tf32", "bf16"):
    pol = get_policy(name)
    with torch.no_grad(), pol.active():
        torch._dynamo.reset()
        paths = [("matmul/softmax/matmul", by_hand), ("torch.compile(matmul/softmax/matmul)", torch.compile(by_hand)),
                 ("sdpa", sdpa)] + ([("sdpa is_causal", sdpa_causal)] if a.causal else [])
        for label, fn in paths:
            if name == "bf16":  # eager under autocast; SDPA on bf16 copies (what the rewrite emits)
                low = [t.to(torch.bfloat16) for t in (q, k, v)]
                call = (lambda fn=fn: fn(*low)) if label.startswith("sdpa") else (lambda fn=fn: fn(q, k, v))
                ctx = torch.autocast("cuda", dtype=torch.bfloat16)
            else:
                call, ctx = (lambda fn=fn: fn(q, k, v)), torch.autocast("cuda", enabled=False)
            with ctx:
                out = call()
                ms = do_bench(call)
                ks = kernels(call)
            err = (out.double() - ref).abs().max().item()
            print(f"| {name} | {label} | {err:.3g} | {ms:.3f} | {tuple(out.stride())} | {'; '.join(ks)} |")
