"""Codegen: Triton and CUDA C++ kernels rendered from template files and one op table per dialect."""
