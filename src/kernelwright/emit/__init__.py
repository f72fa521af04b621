"""Emit: the drop-in `ModelNew` module with its kernels beside it, result.json and report.md."""
