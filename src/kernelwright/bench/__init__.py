"""Bench: time eager, torch.compile and kernelwright over many problems, per-level summaries."""
