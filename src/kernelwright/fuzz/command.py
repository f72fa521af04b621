"""`kernelwright fuzz`: the differential fuzzer from the command line (exit 1 when a program is wrong).

Only typer is imported here: Triton decides interpreter-or-GPU when kernels are defined, so
TRITON_INTERPRET is set for the CPU before the runner (and with it every kernel module) loads."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from kernelwright.errors import UserError


def fuzz(files: Optional[List[Path]] = typer.Argument(None, help="Check these problem files or folders (shipped "
                                                      "problems, fixtures) instead of generated programs."),
         count: int = typer.Option(20, "--count", help="Programs to generate and check."),
         seed: int = typer.Option(0, "--seed", help="Seed of the first program (then seed + 1, ...)."),
         device: Optional[str] = typer.Option(None, "--device",
                                              help="cpu | cuda (default: cuda when a GPU is present)"),
         precision: str = typer.Option("fp32", "--precision", help="fp32 | tf32 | bf16"),
         out: Path = typer.Option(Path("kw_fuzz"), "--out", help="Folder for programs, emitted modules and wrong/."),
         budget: int = typer.Option(2, "--budget", help="Search trials per program."),
         small: bool = typer.Option(False, "--small", help="With files: apply each problem's SMALL overrides."),
         no_library: bool = typer.Option(False, "--no-library",
                                         help="Ship every generated kernel that verifies, even where the library "
                                              "is faster (checks the generated convolutions and fused pairs)."),
         backend: bool = typer.Option(False, "--backend",
                                      help="Check each program compiled with torch.compile(backend=\"kernelwright\") "
                                           "instead of its emitted module (training graphs through AOTAutograd).")):
    """Generate random KernelBench-format programs, optimize each, and check the emitted module
    against eager PyTorch (train and eval mode, another batch size, gradients, float64); with
    --backend, the model compiled with the torch.compile backend instead."""
    from kernelwright.devices import device_option
    from kernelwright.policy import get_policy

    get_policy(precision)
    if count < 1 or budget < 1:
        raise UserError("--count and --budget must be positive")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    dev = device_option(device)
    if dev == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    if files:
        from kernelwright.fuzz.runner import run_files
        from kernelwright.problem import discover

        summary = run_files(discover([str(f) for f in files]), dev, precision, out, budget, small, log=typer.echo,
                            no_library=no_library, backend=backend)
    else:
        from kernelwright.fuzz.runner import run

        summary = run(count, seed, dev, precision, out, budget, log=typer.echo, no_library=no_library, backend=backend)
    if summary.count("wrong"):
        raise typer.Exit(1)
