"""Dev tool (GPU): print the Triton code torch.compile generates for problems, to study its choices.

usage: TORCH_LOGS=output_code python3 scripts/dump_compile_code.py [--tf32] PROBLEM.py... 2> code.txt
"""
import sys

import torch

if "--tf32" in sys.argv:
    sys.argv.remove("--tf32")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
else:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

from kernelwright.problem import load_problem

for path in sys.argv[1:]:
    prob = load_problem(path)
    model = prob.make_model("cuda")
    inputs = prob.make_inputs(0, "cuda")
    print(f"##### {path}", file=sys.stderr, flush=True)
    torch.compile(model)(*inputs)
    torch.cuda.synchronize()
    torch._dynamo.reset()
