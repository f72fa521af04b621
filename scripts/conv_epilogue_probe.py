"""Dev tool (GPU): can the Triton implicit-GEMM conv with a fused epilogue beat cuDNN + epilogue?

For a level-2 conv + pointwise problem shape (conv2d_relu_bias_add: 3x3, 64 -> 128, 224x224,
batch 32), per policy: the library path as kernelwright runs it (input made channels-last, cuDNN
conv, epilogue writing NCHW), the Triton conv reading the channels-last input (copy timed apart)
and reading the NCHW input directly, each over a small config grid; prints one JSON line per
(policy, variant, config) with the median ms, TFLOP/s and the max error against the library.

usage: PYTHONPATH=src python3 scripts/conv_epilogue_probe.py [--policies tf32,bf16] [--pad 0] [--configs 24]
"""
import argparse
import json
import tempfile

import torch
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.codegen.triton_gemm import conv_space, precision_kwargs, render_conv2d
from kernelwright.measure.timer import time_interleaved
from kernelwright.policy import get_policy

ap = argparse.ArgumentParser()
ap.add_argument("--policies", default="tf32,bf16")
ap.add_argument("--pad", type=int, default=0)
ap.add_argument("--configs", type=int, default=24)
ap.add_argument("--shape", default="32,64,128,224,224")
a = ap.parse_args()
B, C, CO, H, W = map(int, a.shape.split(","))
torch.manual_seed(0)
x = torch.randn(B, C, H, W, device="cuda")
w = torch.randn(CO, C, 3, 3, device="cuda") * 0.05
cb = torch.randn(CO, device="cuda") * 0.1
b2 = torch.randn(CO, device="cuda") * 0.02
OH = H + 2 * a.pad - 2
OW = W + 2 * a.pad - 2
flops = 2 * B * CO * OH * OW * C * 9
epi = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "col")),
               "acc = tl.maximum(acc + e0, 0.0) + e1")
mod = load_module_from_source(render_conv2d(epi, name="probe_conv"), "probe_conv", tempfile.mkdtemp())
cl = torch.channels_last

for pol in a.policies.split(","):
    policy = get_policy(pol)
    dt = torch.bfloat16 if pol == "bf16" else torch.float32
    xs = x.to(dt)
    x_cl = xs.contiguous(memory_format=cl)
    w_cl = w.to(dt).contiguous(memory_format=cl)
    kw = precision_kwargs(pol)
    kw["CAST_BF16"] = False  # operands are already bf16 under bf16 (as the plan casts them)

    def library():
        y = F.conv2d(xs.contiguous(memory_format=cl), w_cl)
        return (torch.relu(y + cb.to(dt)[:, None, None]) + b2.to(dt)[:, None, None]).contiguous()

    with policy.active(), torch.no_grad():
        ref = library()
        fns = {"library": library, "x_to_cl": lambda: xs.contiguous(memory_format=cl),
               "cudnn_conv_cl": lambda: F.conv2d(x_cl, w_cl)}
        cands = {}
        for cfg in conv_space(pol, batch=B, Cin=C, Cout=CO, OH=OH, OW=OW, max_configs=a.configs):
            for layout, xin in (("nhwc", x_cl), ("nchw", xs)):
                key = f"triton_{layout} " + json.dumps(cfg, sort_keys=True)
                call = (lambda xin=xin, cfg=cfg: mod.launch(xin, w_cl if xin is x_cl else w.to(dt), cb, b2,
                                                            padding=a.pad, out_dtype=dt, **kw, **cfg))
                try:
                    out = call()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                except Exception as e:  # noqa: BLE001
                    print(json.dumps({"policy": pol, "variant": key, "error": str(e)[:200]}), flush=True)
                    continue
                cands[key] = (call, err)
        t = time_interleaved({**fns, **{k: c for k, (c, _) in cands.items()}}, warmup_s=0.05, min_runs=10,
                             max_runs=20, flush=True)
    for k, v in sorted(t.items(), key=lambda kv: kv[1].median_ms):
        row = {"policy": pol, "variant": k, "ms": round(v.median_ms, 4),
               "tflops": round(flops / (v.median_ms * 1e-3) / 1e12, 1)}
        if k in cands:
            row["max_err"] = cands[k][1]
        print(json.dumps(row), flush=True)
