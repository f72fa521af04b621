"""Verification (docs/design.md, "Verification protocol"): float64 reference, eager-error floor,
fresh input sets, poisoned outputs and anti-cheat checks."""
from kernelwright.verify import anticheat  # first: captures the original timers at import
from kernelwright.verify.compare import excess, excess_reason, poisoned_like
from kernelwright.verify.verifier import SetResult, VerifyResult, verify

__all__ = ["verify", "VerifyResult", "SetResult", "excess", "excess_reason", "poisoned_like", "anticheat"]
