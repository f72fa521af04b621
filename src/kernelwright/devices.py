"""The device a command runs on, from its `--device` option."""
from __future__ import annotations

from kernelwright.errors import UserError


def device_option(device: str | None) -> str:
    """The device a `--device` option names: cuda or cpu, by default cuda when a GPU is visible."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device {device!r}: choose cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible on this machine")
    return device
