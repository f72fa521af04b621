"""Peak GPU memory per stage of a job, against one eager forward's peak (result.json's "memory")."""
from __future__ import annotations

import torch


class MemoryPeak:
    """Peak GPU memory, from the allocator's own statistics, of one eager forward (model, inputs,
    outputs, temporaries) and of each stage of the job after it: tuning, verification, timing."""

    def __init__(self, device: torch.device):
        self.device, self.peaks = device, {}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)

    def mark(self, stage: str) -> None:
        """The peak since the last mark belongs to `stage` (the largest, when a stage repeats)."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - self.base
            self.peaks[stage] = max(self.peaks.get(stage, 0), peak)
            torch.cuda.reset_peak_memory_stats(self.device)

    def report(self) -> dict | None:
        """Per stage (eager, tune, verify, timing) its peak in MiB, and each one's ratio to eager's;
        None off the GPU."""
        if self.device.type != "cuda" or "eager" not in self.peaks:
            return None
        eager = self.peaks["eager"]
        return {**{f"{k}_peak_mib": round(v / (1 << 20), 1) for k, v in self.peaks.items()},
                "ratio": round(max(self.peaks.values()) / eager, 2) if eager else None,
                "verify_tune_ratio": round(max(self.peaks.get("tune", 0), self.peaks.get("verify", 0)) / eager, 2)
                if eager else None}
