"""L2 flushing between timed runs (docs/design.md, "Timing protocol")."""
from __future__ import annotations

import torch

__all__ = ["L2Flusher", "l2_size_bytes", "FALLBACK_L2_BYTES", "NO_GPU"]

NO_GPU = "timing needs a CUDA GPU"
FALLBACK_L2_BYTES = 60 * 1024 * 1024  # used when the device does not report its L2 size


def _cuda_device(device) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError(NO_GPU)
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        raise RuntimeError(f"{NO_GPU} (device {device} given)")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def l2_size_bytes(device=None) -> int:
    """The device's L2 size in bytes, or FALLBACK_L2_BYTES when it does not say."""
    device = _cuda_device(device)
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return int(size) if size > 0 else FALLBACK_L2_BYTES


class L2Flusher:
    """Holds a buffer of at least twice the L2 size; `flush()` writes all of it on the current
    stream, evicting whatever the timed code would otherwise find in L2."""

    def __init__(self, device=None, factor: int = 2):
        self.device = _cuda_device(device)
        self.nbytes = max(2, factor) * l2_size_bytes(self.device)
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=self.device)
        self._value = 0

    def flush(self) -> None:
        self._value ^= 1  # alternate the value so no layer can skip an identical rewrite
        self.buffer.fill_(self._value)
