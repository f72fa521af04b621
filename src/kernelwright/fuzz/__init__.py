"""Differential fuzzing: random KernelBench-format programs (generate), optimized by kernelwright
and checked against eager PyTorch as users call the emitted module (oracle), many at a time
(runner), from the command line (command), and cut down to their smallest failing form (shrink).

Nothing is imported here: the command sets TRITON_INTERPRET before any kernel module loads."""
