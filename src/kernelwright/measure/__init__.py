"""Timing (docs/design.md, "Timing protocol"): CUDA events, L2 flush, interleaved rounds, baselines
(eager and torch.compile) under the same precision policy."""
from kernelwright.measure.baselines import Baselines, make_baselines, time_problem
from kernelwright.measure.l2 import L2Flusher, l2_size_bytes
from kernelwright.measure.timer import NO_GPU, Timing, round_order, runs_for_budget, time_interleaved

__all__ = ["Timing", "time_interleaved", "round_order", "runs_for_budget", "L2Flusher", "l2_size_bytes",
           "make_baselines", "time_problem", "Baselines", "NO_GPU"]
