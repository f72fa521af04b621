"""kernelwright: writes, verifies and times GPU kernels for PyTorch programs."""

__version__ = "0.1.0"
