"""Precision policies (docs/design.md): what the GPU may round to, and the tolerance that goes with it.

A policy is applied to *both* sides of every comparison: baselines are always timed under the
same policy as the candidate (matched precision).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from kernelwright.errors import UserError


@dataclass(frozen=True)
class Policy:
    name: str
    tol: float
    allow_tf32: bool
    operand_dtype: torch.dtype  # dtype GEMM/conv operands are cast to by generated kernels
    triton_input_precision: str  # value for tl.dot(input_precision=...)
    autocast_dtype: torch.dtype | None = None  # baselines run under torch.autocast to this dtype

    @contextlib.contextmanager
    def active(self):
        """Set torch's TF32 switches for the duration of the block, then restore them."""
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.allow_tf32
        try:
            yield self
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    def baseline(self, device="cuda"):
        """The context eager PyTorch and torch.compile run in under this policy: bf16 autocast
        for `bf16` (GEMM / convolution operands cast to bf16, fp32 accumulation, as a PyTorch
        user gets it), nothing for fp32 / tf32. kernelwright's own modules carry explicit casts
        (plan.rewrites.bf16_operands) and never need it."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.autocast_dtype)


POLICIES = {
    "fp32": Policy("fp32", 1e-4, False, torch.float32, "ieee"),
    "tf32": Policy("tf32", 1e-2, True, torch.float32, "tf32"),
    "bf16": Policy("bf16", 1e-2, False, torch.bfloat16, "ieee", torch.bfloat16),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise UserError(f"unknown precision policy {name!r}; choose one of {', '.join(POLICIES)}") from None
