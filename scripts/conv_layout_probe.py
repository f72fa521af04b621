"""Dev tool (GPU): why is torch.compile's convolution faster than eager's? Times one problem's
convolution in NCHW, in channels-last with and without the layout conversions, with
cudnn.benchmark, and the whole model eager vs torch.compile, under fp32 and tf32.

usage: python3 scripts/conv_layout_probe.py PROBLEM.py... > probe.json
"""
import json
import sys

import torch

from kernelwright.measure.timer import time_interleaved
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

rows = []
for path in sys.argv[1:]:
    prob = load_problem(path)
    model = prob.make_model("cuda").eval()
    x = prob.make_inputs(0, "cuda")[0]
    conv = next(m for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)))
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    x_cl = x.contiguous(memory_format=fmt)
    w, b = conv.weight.detach(), conv.bias.detach() if conv.bias is not None else None
    w_cl = w.contiguous(memory_format=fmt)
    fwd = conv._conv_forward
    for pol in ("fp32", "tf32"):
        policy = get_policy(pol)
        with policy.active(), torch.no_grad():
            compiled = torch.compile(model)
            compiled(x)
            fns = {
                "conv_nchw": lambda: fwd(x, w, b),
                "conv_cl_preconverted": lambda: fwd(x_cl, w_cl, b),
                "conv_cl_with_conversions": lambda: fwd(x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt), b).contiguous(),
                "model_eager": lambda: model(x),
                "model_compile": lambda: compiled(x),
            }
            t = time_interleaved(fns, warmup_s=0.2, min_runs=30, max_runs=60, flush=True)
            torch.backends.cudnn.benchmark = True
            fwd(x, w, b)
            fwd(x_cl, w_cl, b)
            tb = time_interleaved({"conv_nchw_benchmark": lambda: fwd(x, w, b),
                                   "conv_cl_benchmark": lambda: fwd(x_cl, w_cl, b)}, warmup_s=0.2, min_runs=30, max_runs=60)
            torch.backends.cudnn.benchmark = False
        row = {"problem": prob.name, "policy": pol, "input": list(x.shape)}
        row.update({k: round(v.median_ms, 4) for k, v in {**t, **tb}.items()})
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch._dynamo.reset()
