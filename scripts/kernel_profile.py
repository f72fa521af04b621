"""Dev tool (GPU): optimize problems, then list the kernels that eager PyTorch, torch.compile and
kernelwright's emitted module launch per call, with their device time (torch.profiler).

usage: PYTHONPATH=src python3 scripts/kernel_profile.py --precision tf32 --budget 8 --out DIR PROBLEM.py...
Writes DIR/<problem>/ (the optimize output) and DIR/kernel_profile.txt / .jsonl.
"""
import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.measure.baselines import make_baselines
from kernelwright.measure.profile import format_kernel_table, kernel_times
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("problems", nargs="+")
ap.add_argument("--precision", default="fp32")
ap.add_argument("--budget", type=int, default=8)
ap.add_argument("--out", required=True)
ap.add_argument("--calls", type=int, default=10)
args = ap.parse_args()

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
policy = get_policy(args.precision)
text = open(out / "kernel_profile.txt", "a")
rows = open(out / "kernel_profile.jsonl", "a")
for path in args.problems:
    prob = load_problem(path)
    res = optimize_problem(prob, out / prob.name, Options(budget_trials=args.budget, precision=args.precision,
                                                          device="cuda", log=lambda s: None))
    inputs = prob.make_inputs(0, "cuda")
    with torch.no_grad(), policy.active():
        model = prob.make_model("cuda")
        base = make_baselines(prob, policy, "cuda", inputs=inputs, model=model)  # under bf16: autocast wrappers
        impls = dict(base)
        impls["kernelwright"] = model_new_like(import_model_new(out / prob.name / "model_new.py"), prob, model, "cuda")
        text.write(f"##### {prob.name} ({args.precision}; verify {res['verify']['passed']})\n")
        for name, fn in impls.items():
            kt = kernel_times(lambda: fn(*inputs), calls=args.calls)
            text.write(format_kernel_table(name, kt) + "\n")
            rows.write(json.dumps({"problem": prob.name, "precision": args.precision, "impl": name,
                                   "kernels": [asdict(k) for k in kt]}) + "\n")
        text.flush()
        rows.flush()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
