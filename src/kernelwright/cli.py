"""Command line: doctor, inspect, optimize, bench, report (see design.md's contract).

Exit codes: 0 success, 2 bad input (one line on stderr), 1 internal error.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from kernelwright.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="kernelwright: writes, verifies and times GPU kernels for PyTorch programs.")
_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")):
    _state["debug"] = debug


def parse_budget(values: list[str] | None) -> tuple[int | None, float | None]:
    """`--budget 40` (trials) and/or `--budget 90s` (seconds); the first reached stops."""
    trials, seconds = None, None
    for v in values or []:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min)?\s*", v)
        if not m:
            raise UserError(f"--budget {v!r}: expected a number of trials (40) or seconds (90s)")
        num, unit = float(m.group(1)), m.group(2)
        if unit in ("s", "sec"):
            seconds = num
        elif unit in ("m", "min"):
            seconds = num * 60
        else:
            if not num.is_integer() or num < 1:
                raise UserError(f"--budget {v!r}: a trial budget is a positive whole number")
            trials = int(num)
    return trials, seconds


def _device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device {device!r}: choose cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible on this machine")
    return device


def _use_interpreter_if_cpu(device: str | None):
    """Triton decides interpreter-or-GPU when kernels are defined: set it before any kernel import."""
    if device == "cpu" or (device is None and not _has_gpu()):
        os.environ["TRITON_INTERPRET"] = "1"


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@app.command()
def doctor():
    """GPU, driver, library versions, NVRTC and Triton interpreter availability."""
    from kernelwright.doctor import collect, render

    typer.echo(render(collect()))


@app.command()
def inspect(problem: Path = typer.Argument(..., help="KernelBench-format problem file"),
            as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
            device_name: Optional[str] = typer.Option(None, "--device-name", help="Roofline for this device (default: the GPU here, else H200)."),
            precision: str = typer.Option("fp32", "--precision"),
            small: bool = typer.Option(False, "--small", help="Apply the problem's SMALL size overrides.")):
    """Captured graph: per node class, shapes, FLOPs, bytes, roofline time and bound."""
    from kernelwright.analyze import analyze, device_spec, render_table
    from kernelwright.capture import CaptureError, capture
    from kernelwright.problem import load_problem

    p = load_problem(problem, small=small)
    p.check("meta")  # forward must run and return tensors (shapes only, nothing is computed)
    try:
        graph = capture(p)
    except CaptureError as e:
        raise UserError(f"{problem}: cannot capture: {e}") from e
    a = analyze(graph, device_spec(device_name), precision)
    if as_json:
        typer.echo(json.dumps(a.to_json(), indent=2, default=str))
    else:
        from rich.console import Console

        Console(width=160).print(render_table(a))


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_compile_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise UserError(f"--compile-mode {mode!r}: choose {', '.join(COMPILE_MODES)}")


@app.command()
def optimize(problem: Path = typer.Argument(..., help="KernelBench-format problem file"),
             out: Path = typer.Option(..., "--out", help="Output folder for model_new.py, kernels, result.json, report.md"),
             budget: Optional[List[str]] = typer.Option(None, "--budget", help="Trials (40) and/or seconds (90s) per problem."),
             precision: str = typer.Option("fp32", "--precision", help="fp32 | tf32 | bf16"),
             device: Optional[str] = typer.Option(None, "--device", help="cuda | cpu (default: cuda when a GPU is present)"),
             backend: str = typer.Option("all", "--backend", help="triton | cuda | all"),
             small: bool = typer.Option(False, "--small", help="Apply the problem's SMALL size overrides (CPU tests, demos)."),
             db: Optional[Path] = typer.Option(None, "--db", help="Trial database (default $KERNELWRIGHT_DB or ~/.cache/kernelwright/trials.jsonl)"),
             cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                              help="Also time the forward replayed as CUDA graphs; ship it when faster."),
             compile_mode: str = typer.Option("default", "--compile-mode",
                                              help="torch.compile mode of the baseline: " + " | ".join(COMPILE_MODES))):
    """Generate, verify, time and choose kernels; write a drop-in ModelNew and a report."""
    from kernelwright.policy import get_policy

    trials, seconds = parse_budget(budget)
    if trials is None and seconds is None:
        trials = 40
    get_policy(precision)
    _check_compile_mode(compile_mode)
    if backend not in ("triton", "cuda", "all"):
        raise UserError(f"--backend {backend!r}: choose triton, cuda or all")
    _use_interpreter_if_cpu(device)
    dev = _device(device)
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.problem import load_problem

    p = load_problem(problem, small=small)
    p.check("meta")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    opts = Options(budget_trials=trials, budget_s=seconds, precision=precision, device=dev, backend=backend,
                   db_path=str(db) if db else None, small=small, cuda_graphs=cuda_graphs, compile_mode=compile_mode,
                   log=lambda s: typer.echo(s, err=True))
    result = optimize_problem(p, out, opts)
    typer.echo(f"{out}/model_new.py written; report: {out}/report.md")
    if result.get("verify_fallback"):
        typer.echo("the generated program FAILED verification; model_new.py runs the original forward "
                   "(see report.md)", err=True)
    if not (result.get("verify") or {}).get("passed"):
        typer.echo("the emitted module FAILED verification (see report.md)", err=True)
        raise typer.Exit(1)


@app.command()
def bench(paths: List[Path] = typer.Argument(..., help="Problem files or folders"),
          baseline_only: bool = typer.Option(False, "--baseline-only", help="Time eager and torch.compile only."),
          precision: str = typer.Option("fp32", "--precision"),
          budget: Optional[List[str]] = typer.Option(None, "--budget"),
          json_out: Optional[Path] = typer.Option(None, "--json", help="Write all results as JSON here."),
          out: Path = typer.Option(Path("kw_runs"), "--out", help="Folder for per-problem optimize outputs."),
          small: bool = typer.Option(False, "--small"),
          compile_mode: str = typer.Option("default", "--compile-mode",
                                           help="torch.compile mode of the baseline: " + " | ".join(COMPILE_MODES)),
          cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                           help="Let kernelwright ship CUDA-graph replay where it measures faster.")):
    """Time eager, torch.compile (and kernelwright) over problems; per-level geometric means."""
    from kernelwright.bench.runner import run_bench
    from kernelwright.policy import get_policy
    from kernelwright.problem import discover

    get_policy(precision)
    _check_compile_mode(compile_mode)
    trials, seconds = parse_budget(budget)
    files = discover([str(p) for p in paths])
    if not files:
        raise UserError("no problem files found under " + ", ".join(map(str, paths)))
    if not _has_gpu():
        raise UserError("bench times kernels and needs a CUDA GPU; none is visible (try `kernelwright optimize --device cpu`)")
    from kernelwright.measure.watchdog import limit_seconds

    limit_seconds()  # a bad $KERNELWRIGHT_HANG_S: one line, before any worker starts
    run_bench(files, baseline_only=baseline_only, precision=precision, trials=trials or (None if seconds else 40),
              seconds=seconds, json_out=json_out, out_dir=out, small=small, compile_mode=compile_mode,
              cuda_graphs=cuda_graphs, echo=lambda s: typer.echo(s))


@app.command()
def report(folder: Path = typer.Argument(..., help="An optimize output folder")):
    """Print (and rewrite) report.md from result.json."""
    from kernelwright.emit.report import write_report

    res = folder / "result.json"
    if not res.exists():
        raise UserError(f"{folder}: no result.json (run `kernelwright optimize ... --out {folder}` first)")
    try:
        result = json.loads(res.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{res}: not valid JSON ({e.msg})") from e
    typer.echo(write_report(folder, result).read_text())


def main():
    try:
        app(standalone_mode=False)
    except UserError as e:
        if _state["debug"]:
            raise
        print(f"kernelwright: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("kernelwright: aborted", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # noqa: BLE001
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # click/typer usage errors
            print(f"kernelwright: error: {e.format_message()}", file=sys.stderr)
            sys.exit(2)
        if _state["debug"] or "--debug" in sys.argv:
            raise
        print(f"kernelwright: internal error: {type(e).__name__}: {(str(e).splitlines() or [''])[0]} (rerun with --debug)", file=sys.stderr)
        sys.exit(1)
