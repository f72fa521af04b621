"""Command line: doctor, inspect, optimize, bench, report (see docs/design.md's contract).

Exit codes: 0 success; 2 bad input (one line on stderr, `kernelwright: error: ...`); 1 an
internal error or an emitted module that failed verification (one line saying so); 130 Ctrl-C
(`kernelwright: interrupted`). No traceback unless `--debug` is given, anywhere on the line.
`optimize` writes its output atomically: the pipeline runs into a staging folder beside `--out`
whose contents move into `--out` only when the run finishes, so a failed or interrupted run leaves
`--out` as it was.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

import typer

from kernelwright.devices import device_option
from kernelwright.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="kernelwright: writes, verifies and times GPU kernels for PyTorch programs.")
_state = {"debug": False}


INTERRUPTED = 130  # the exit code of a run ended by Ctrl-C (typer's, and the shell's 128 + SIGINT)


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (accepted anywhere on the line).")):
    """`main` takes `--debug` out of the line wherever it is; this option documents it in --help and
    serves callers that run `app` directly."""
    _state["debug"] = _state["debug"] or debug


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
MODE_HELP = ("Training modes to generate a forward for: train | eval | both (a model whose result does not "
             "depend on its mode gets one forward for both); a mode without one runs the original forward.")
VERIFY_ONLY_HELP = "On a GPU: verify generated kernels there, without tuning trials or timing (configs untimed)."
NO_REWRITES_HELP = ("Leave out the exact algebra rules (plan/algebra.py: reductions of matrix products and "
                    "convolutions, over size-1 dims, through affine ops), which change what is computed.")
RETUNE_HELP = ("Search every unit again and time the result again; without it a unit this device measured before "
               "(same precision and kernelwright version, in the trial database) runs its fastest stored config "
               "alone, verified and timed, and emitted files timed before on this GPU are verified and their stored "
               "timing reported.")
SEARCH_HELP = ("model: each unit's expert seeds first, then the cost model's picks; random: each unit's seeds, "
               "then its other configs in a uniformly random order, the seeds marked in the trial records (a "
               "sample of the space for scripts/cost_model_curve.py --replay).")
NCU_HELP = ("Profile the emitted module's generated kernels with Nsight Compute (ncu on PATH, --clock-control "
            "none): achieved occupancy, DRAM throughput, shared-memory bank conflicts, duration per unit, in "
            "result.json and the reports; without ncu or a GPU the reports say so.")
NO_LIBRARY_HELP = ("Every unit with a generated strategy uses it, even where the library call is faster "
                   "(report.md lists the units left to a library).")


def _check_mode(mode: str) -> None:
    if mode not in ("train", "eval", "both"):
        raise UserError(f"--mode {mode!r}: choose train, eval or both")


def _check_compile_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise UserError(f"--compile-mode {mode!r}: choose {', '.join(COMPILE_MODES)}")


def _out_folder(text: str, option: str = "--out") -> Path:
    """The output folder `text` names, checked before any work starts: not empty, a folder or
    nothing yet, and writable, as is the folder its output is staged in (see `_staged`)."""
    if not text.strip():
        raise UserError(f"{option} is empty: name the output folder")
    out = Path(text)
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise UserError(f"{option} {out}: exists and is not a folder")
    home = _staging_home(out)
    if not home.is_dir():
        raise UserError(f"{option} {out}: cannot be created, {home} is not a folder")
    for folder in (home, out) if out.is_dir() else (home,):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"{option} {out}: cannot write in {folder} (permission denied)")
    return out


def _staging_home(out: Path) -> Path:
    """Where `out`'s output is staged: its parent folder, or the nearest existing folder above it
    when the parent is not made yet (on the file system `out` will be on, so the output moves in
    by renaming; the parents are made only once the run has finished)."""
    home = Path(os.path.abspath(out)).parent
    while not home.exists() and home != home.parent:
        home = home.parent
    return home


def _staging_prefix(out: Path) -> str:
    """Name prefix of `out`'s staging folders; the process id lets a later run tell a folder left
    by a process that ended without cleaning up (a hang exit, a kill) from one in use."""
    return f".{Path(os.path.abspath(out)).name}.partial-"


def _remove_stale_staging(out: Path, home: Path) -> None:
    """Remove the staging folders of `out` in `home` whose process no longer runs."""
    prefix = _staging_prefix(out)
    for entry in home.iterdir():
        pid = entry.name[len(prefix):].split("-", 1)[0] if entry.name.startswith(prefix) else ""
        if pid.isdigit() and entry.is_dir() and not _running(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts; off POSIX, where probing a process
    with signal 0 would end it, every process counts as running)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


RECORDS = ("result.json", "report.md")  # the files of an optimize output that may name its folder


def _staged(out: Path, run: Callable[[Path], dict]) -> dict:
    """`run(folder)` into a fresh staging folder beside `out`, then move what it wrote into `out`
    (see `_commit`) and return its result. On any exception, Ctrl-C included, the staging folder is
    removed and `out` is left as it was. Paths into the staging folder in result.json and report.md
    (a failed candidate's message naming its file under .build/) are rewritten to name `out`."""
    home = _staging_home(out)
    _remove_stale_staging(out, home)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(out)}{os.getpid()}-", dir=home))
    except OSError as e:
        raise UserError(f"--out {out}: cannot create a folder in {home} ({e.strerror})") from e
    try:
        result = run(staging)
        _rename_in_records(staging, Path(os.path.abspath(out)))
        _commit(staging, out)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _rename_in_records(staging: Path, out: Path) -> None:
    """Replace `staging` by `out` in the RECORDS files under `staging`, as written and as JSON
    escapes it."""
    names = {str(staging), str(staging.resolve())}
    pairs = [(n, str(out)) for n in names] + [(json.dumps(n)[1:-1], json.dumps(str(out))[1:-1]) for n in names]
    for record in RECORDS:
        path = staging / record
        if not path.is_file():
            continue
        text = fixed = path.read_text()
        for old, new in pairs:
            fixed = fixed.replace(old, new)
        if fixed != text:
            path.write_text(fixed)


def _commit(staging: Path, out: Path) -> None:
    """Move `staging`'s entries into `out`, all or none: a missing `out` is `staging` renamed; in an
    existing one, entries of the same name are replaced and other files are left alone. If a move
    fails (or Ctrl-C comes) half way, the entries moved so far go back and `out` is as it was."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out)
        return
    backup = Path(tempfile.mkdtemp(prefix=f".{Path(os.path.abspath(out)).name}.old-", dir=_staging_home(out)))
    moved, replaced = [], []
    try:
        for entry in sorted(staging.iterdir()):
            target = out / entry.name
            if target.exists() or target.is_symlink():
                os.rename(target, backup / entry.name)
                replaced.append(entry.name)
            os.rename(entry, target)
            moved.append(entry.name)
    except BaseException:
        for name in moved:
            os.rename(out / name, staging / name)
        for name in replaced:
            os.rename(backup / name, out / name)
        raise
    finally:
        shutil.rmtree(backup, ignore_errors=True)


def _verdict(result: dict, out: Path) -> None:
    """One line on stderr when the emitted module is not the verified generated program: exit 1
    when it failed verification (the output is kept, to read report.md), a note when the generated
    program failed and the verified original forward ships instead."""
    if not (result.get("verify") or {}).get("passed"):
        typer.echo(f"kernelwright: verification failed: the emitted module FAILED verification; "
                   f"output kept in {out} (see {out}/report.md)", err=True)
        raise typer.Exit(1)
    if result.get("verify_fallback"):
        typer.echo("kernelwright: the generated program FAILED verification; the original forward was kept "
                   f"in model_new.py (see {out}/report.md)", err=True)


@app.command()
def optimize(problem: Path = typer.Argument(..., help="KernelBench-format problem file"),
             out: str = typer.Option(..., "--out", help="Output folder for model_new.py, kernels, result.json, report.md"),
             budget: Optional[List[str]] = typer.Option(None, "--budget", help="Trials (40) and/or seconds (90s) per problem."),
             precision: str = typer.Option("fp32", "--precision", help="fp32 | tf32 | bf16"),
             device: Optional[str] = typer.Option(None, "--device", help="cuda | cpu (default: cuda when a GPU is present)"),
             backend: str = typer.Option("all", "--backend", help="triton | cuda | all"),
             small: bool = typer.Option(False, "--small", help="Apply the problem's SMALL size overrides (CPU tests, demos)."),
             db: Optional[Path] = typer.Option(None, "--db", help="Trial database (default $KERNELWRIGHT_DB or ~/.cache/kernelwright/trials.sqlite)"),
             cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                              help="Also time the forward replayed as CUDA graphs; ship it when faster."),
             compile_mode: str = typer.Option("default", "--compile-mode",
                                              help="torch.compile mode of the baseline: " + " | ".join(COMPILE_MODES)),
             mode: str = typer.Option("both", "--mode", help=MODE_HELP),
             verify_only: bool = typer.Option(False, "--verify-only", help=VERIFY_ONLY_HELP),
             no_library: bool = typer.Option(False, "--no-library", help=NO_LIBRARY_HELP),
             no_rewrites: bool = typer.Option(False, "--no-rewrites", help=NO_REWRITES_HELP),
             retune: bool = typer.Option(False, "--retune", help=RETUNE_HELP),
             search: str = typer.Option("model", "--search", help=SEARCH_HELP),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines (one per searched unit)."),
             json_summary: bool = typer.Option(False, "--json", help="Print a one-line JSON summary on stdout: "
                                               "verification, times, speedups, the output folder."),
             single_file: bool = typer.Option(False, "--single-file",
                                              help="Write model_new.py with the kernels and their runtime embedded "
                                                   "(no kernels/ folder)."),
             ncu: bool = typer.Option(False, "--ncu", help=NCU_HELP)):
    """Generate, verify, time and choose kernels; write a drop-in ModelNew and a report."""
    from kernelwright.policy import get_policy

    trials, seconds = parse_budget(budget)
    if trials is None and seconds is None:
        trials = 40
    get_policy(precision)
    _check_compile_mode(compile_mode)
    if backend not in ("triton", "cuda", "all"):
        raise UserError(f"--backend {backend!r}: choose triton, cuda or all")
    if search not in ("model", "random"):
        raise UserError(f"--search {search!r}: choose model or random")
    out_dir = _out_folder(out)
    _use_interpreter_if_cpu(device)
    dev = device_option(device)
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.problem import load_problem

    p = load_problem(problem, small=small)
    p.check("meta")
    _check_mode(mode)
    opts = Options(budget_trials=trials, budget_s=seconds, precision=precision, device=dev, backend=backend,
                   db_path=str(db) if db else None, small=small, cuda_graphs=cuda_graphs, compile_mode=compile_mode,
                   mode=mode, timed=not verify_only, no_library=no_library, no_rewrites=no_rewrites, retune=retune,
                   search=search, log=(lambda s: None))
    opts.log, opts.progress, status = _progress(quiet)

    notes: list[str | None] = []  # lines for stderr once the live status line is gone

    def run(folder: Path) -> dict:
        result = optimize_problem(p, folder, opts)
        if ncu:
            notes.append(_ncu_profile(folder, result))
        if single_file:
            from kernelwright.emit.module import single_file as fold

            fold(folder)
        _html_report(folder, result, db)
        return result

    with status:
        result = _staged(out_dir, run)
    for note in filter(None, notes):
        typer.echo(note, err=True)
    if json_summary:
        typer.echo(json.dumps(_summary(result, out_dir)))
    else:
        typer.echo(f"{out_dir}/model_new.py written; report: {out_dir}/report.md (and report.html)")
    _verdict(result, out_dir)


def _progress(quiet: bool, console=None):
    """(log, trial, context) for optimize's progress: nothing with --quiet; one line per searched
    unit on stderr; on a terminal (or on `console`, a rich Console) also a live status line below
    them: units done, the current unit's trials against its budget and its best time so far (`trial`
    takes a search.plan_search.TrialProgress after every trial; None off a terminal)."""
    from contextlib import nullcontext

    if quiet:
        return (lambda s: None), None, nullcontext()
    if console is None and not sys.stderr.isatty():
        return (lambda s: typer.echo(s, err=True)), None, nullcontext()
    from rich.console import Console

    console = console or Console(stderr=True)
    status = console.status("capturing and planning")
    done = [0]

    def log(line: str) -> None:
        done[0] += 1
        console.print(line, markup=False, highlight=False)
        status.update(f"{done[0]} done; searching the next unit (last: {line[:70]})")

    def trial(p) -> None:
        budget = f"/{p.budget}" if p.budget else ""
        best = f", best {p.best_ms:.3f} ms" if p.best_ms is not None else ""
        status.update(f"{done[0]} done; {p.unit}: trial {p.done}{budget}{best}")

    return log, trial, status


def _ncu_profile(folder: Path, result: dict) -> str | None:
    """Nsight Compute counters of the module in `folder` into `result`, result.json and report.md;
    when there are none (no ncu, no GPU, counters not permitted), the line for stderr saying why."""
    from kernelwright.emit.report import write_report
    from kernelwright.measure.ncu import attach, profile_output, summary_line

    try:
        profile = profile_output(folder, result)
    except Exception as e:  # noqa: BLE001 - the counters are an extra: a run never fails for them
        profile = {"status": f"profiling failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"}
    attach(result, profile)
    (folder / "result.json").write_text(json.dumps(result, indent=2, default=str))
    write_report(folder, result)
    return None if result["ncu"].get("status") == "ok" else f"kernelwright: {summary_line(result)}"


def _html_report(folder: Path, result: dict, db: Optional[Path]) -> None:
    """report.html beside report.md; a page that cannot be drawn costs one line on stderr, not the run."""
    from kernelwright.emit.report_html import write_html_report
    from kernelwright.search.database import default_db_path

    try:
        write_html_report(folder, result, default_db_path(db))
    except Exception as e:  # noqa: BLE001 - the report is a view of result.json, which is written
        typer.echo(f"kernelwright: report.html not written ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})",
                   err=True)


def _summary(result: dict, out: Path) -> dict:
    """optimize --json: what a script needs from result.json in one line."""
    timing = result.get("timing") or {}
    times = {k: v["median_ms"] for k, v in timing.items() if isinstance(v, dict) and "median_ms" in v}
    kw = times.get("kernelwright")
    return {"problem": result.get("problem"), "out": str(out), "precision": result.get("precision"),
            "verified": bool((result.get("verify") or {}).get("passed")), "times_ms": times,
            "speedup_vs_eager": times["eager"] / kw if kw and times.get("eager") else None,
            "speedup_vs_compile": times["compile"] / kw if kw and times.get("compile") else None}


@app.command()
def bench(paths: List[Path] = typer.Argument(..., help="Problem files or folders"),
          baseline_only: bool = typer.Option(False, "--baseline-only", help="Time eager and torch.compile only."),
          precision: str = typer.Option("fp32", "--precision"),
          budget: Optional[List[str]] = typer.Option(None, "--budget"),
          json_out: Optional[Path] = typer.Option(None, "--json", help="Write all results as JSON here."),
          out: str = typer.Option("kw_runs", "--out", help="Folder for per-problem optimize outputs."),
          small: bool = typer.Option(False, "--small"),
          device: Optional[str] = typer.Option(None, "--device", help="cuda | cpu (default: cuda when a GPU is "
                                               "present). On the CPU each problem is optimized untimed, its "
                                               "kernels in Triton's interpreter; the rows report verification."),
          cluster: Optional[str] = typer.Option(None, "--cluster", help="Run the problems on Dask distributed "
                                                "workers: local:N (N worker processes here, one per GPU) or "
                                                "tcp://HOST:PORT (a running scheduler; workers started with "
                                                "`dask worker ADDRESS --nthreads 1 --resources GPU=1`). "
                                                "Needs the cluster extra."),
          db: Optional[Path] = typer.Option(None, "--db", help="Trial database (default $KERNELWRIGHT_DB or "
                                            "~/.cache/kernelwright/trials.sqlite)"),
          compile_mode: str = typer.Option("default", "--compile-mode",
                                           help="torch.compile mode of the baseline: " + " | ".join(COMPILE_MODES)),
          cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                           help="Let kernelwright ship CUDA-graph replay where it measures faster."),
          mode: str = typer.Option("both", "--mode", help=MODE_HELP),
          verify_only: bool = typer.Option(False, "--verify-only", help=VERIFY_ONLY_HELP),
          no_library: bool = typer.Option(False, "--no-library", help=NO_LIBRARY_HELP),
          no_rewrites: bool = typer.Option(False, "--no-rewrites", help=NO_REWRITES_HELP),
          report_dir: Optional[str] = typer.Option(None, "--report", help="Write DIR/bench.html: per-level table, "
                                                   "fast_p, geometric means, the speedup distribution."),
          rewrites_ab: bool = typer.Option(False, "--rewrites-ab", help="Also optimize each problem where an exact "
                                           "algebra rule applies with --no-rewrites, and report the geomean both ways "
                                           "(a problem no rule changes is the same program either way)."),
          train: bool = typer.Option(False, "--train", help="Time training steps (forward, loss, backward, SGD) "
                                     "under eager, torch.compile and torch.compile(backend=\"kernelwright\") with "
                                     "each partition of the joint graph (recompute, save), from the same weights; "
                                     "each first step checked against float64 eager."),
          steps: int = typer.Option(100, "--steps", help="Training steps per implementation with --train (the last "
                                    "third, at most 30, timed).")):
    """Time eager, torch.compile (and kernelwright) over problems; per-level geometric means."""
    from kernelwright.bench.runner import run_bench
    from kernelwright.policy import get_policy
    from kernelwright.problem import discover

    get_policy(precision)
    _check_mode(mode)
    _check_compile_mode(compile_mode)
    trials, seconds = parse_budget(budget)
    out_dir = _out_folder(out)
    report_folder = _out_folder(report_dir, "--report") if report_dir is not None else None
    files = discover([str(p) for p in paths])
    if not files:
        raise UserError("no problem files found under " + ", ".join(map(str, paths)))
    _use_interpreter_if_cpu(device)
    dev = device_option(device) if device is not None else ("cuda" if _has_gpu() else "cpu")
    if dev == "cpu" and (baseline_only or train or report_folder is not None):
        what = "--baseline-only" if baseline_only else ("--train" if train else "--report")
        raise UserError(f"{what} times kernels and needs a CUDA GPU; bench --device cpu reports verification only")
    if cluster is not None:
        from kernelwright.bench.cluster import parse_cluster, require_distributed

        parse_cluster(cluster)
        require_distributed()
        if train:
            raise UserError("--cluster runs the optimize bench; leave out --train")
    from kernelwright.measure.watchdog import limit_seconds

    limit_seconds()  # a bad $KERNELWRIGHT_HANG_S: one line, before any worker starts
    if rewrites_ab and no_rewrites:
        raise UserError("--rewrites-ab times the problems with and without the rewrites; leave out --no-rewrites")
    if train:
        from kernelwright.bench.training import run_train_bench

        if steps < 2:
            raise UserError(f"--steps {steps}: a training benchmark needs at least 2 steps")
        impls = _train_impls(compile_mode, baseline_only, dict(
            precision=precision, budget_trials=trials, budget_s=seconds, no_library=no_library,
            no_rewrites=no_rewrites, cuda_graphs=cuda_graphs, compile_mode=compile_mode))
        run_train_bench(files, get_policy(precision), impls, steps, max(1, min(30, steps // 3)), json_out,
                        lambda s: typer.echo(s), small=small)
        return
    ran = run_bench(files, baseline_only=baseline_only, precision=precision, trials=trials or (None if seconds else 40),
                    seconds=seconds, json_out=json_out, out_dir=out_dir, small=small, compile_mode=compile_mode,
                    cuda_graphs=cuda_graphs, echo=lambda s: typer.echo(s), mode=mode, timed=not verify_only,
                    no_library=no_library, no_rewrites=no_rewrites, rewrites_ab=rewrites_ab, device=dev,
                    cluster=cluster, db_path=str(db) if db else None)
    if report_folder is not None:
        rows, summary = ran
        import torch

        from kernelwright.emit.bench_html import write_bench_report

        options = dict(baseline_only=baseline_only, precision=precision, trials=trials or (None if seconds else 40),
                       seconds=seconds, compile_mode=compile_mode)
        page = write_bench_report(report_folder, {"rows": rows, "summary": summary, "options": options,
                                                  "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__})
        typer.echo(f"{page} written")


def _train_impls(compile_mode: str, baseline_only: bool, options: dict) -> dict:
    """bench --train's implementations: name -> how a fresh model copy is called ("kernelwright"
    partitions the joint graph by recomputing, "kernelwright-save" by saving: both timed)."""
    import torch

    def compiled(**how):
        def wrap(model):
            torch._dynamo.reset()  # each implementation captures its own graphs
            return torch.compile(model, dynamic=False, **how)
        return wrap

    impls = {"eager": lambda model: model, "compile": compiled(mode=compile_mode)}
    if not baseline_only:
        from kernelwright.backend import backend

        given = {k: v for k, v in options.items() if v is not None}
        impls["kernelwright"] = compiled(backend=backend(**given))
        impls["kernelwright-save"] = compiled(backend=backend(partition="save", **given))
    return impls


RESULT_KEYS = ("problem", "precision", "device")  # what every result.json names


@app.command()
def report(folder: str = typer.Argument(..., help="An optimize output folder"),
           db: Optional[Path] = typer.Option(None, "--db", help="Trial database for the search curves of report.html "
                                             "(default $KERNELWRIGHT_DB, else ~/.cache/kernelwright/trials.sqlite)"),
           ncu: bool = typer.Option(False, "--ncu", help=NCU_HELP)):
    """Print (and rewrite) report.md from result.json, and write report.html beside it."""
    from kernelwright.emit.report import write_report
    from kernelwright.emit.report_html import write_html_report
    from kernelwright.search.database import default_db_path

    result = _read_result(folder)
    if ncu:
        try:
            note = _ncu_profile(Path(folder), result)
        except OSError as e:
            raise UserError(f"{Path(folder) / 'result.json'}: cannot write ({e.strerror})") from e
        if note:
            typer.echo(note, err=True)
    for name, write in (("report.md", lambda: write_report(Path(folder), result)),
                        ("report.html", lambda: write_html_report(Path(folder), result, default_db_path(db)))):
        try:
            path = write()
        except OSError as e:
            raise UserError(f"{Path(folder) / name}: cannot write ({e.strerror})") from e
        if name == "report.md":
            typer.echo(path.read_text())
        else:
            typer.echo(f"{path} written", err=True)


def _read_result(folder: str) -> dict:
    """result.json of the optimize output `folder`; a missing folder or file, or one that is not
    an optimize result, is bad input."""
    if not folder.strip():
        raise UserError("the folder is empty: name an optimize output folder")
    where = Path(folder)
    if not where.is_dir():
        raise UserError(f"{where}: {'not a folder' if where.exists() else 'no such folder'}")
    res = where / "result.json"
    if not res.is_file():
        raise UserError(f"{where}: no result.json (run `kernelwright optimize ... --out {where}` first)")
    try:
        result = json.loads(res.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{res}: not valid JSON ({e.msg})") from e
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{res}: cannot read ({getattr(e, 'strerror', None) or e})") from e
    missing = [k for k in RESULT_KEYS if not isinstance(result, dict) or k not in result]
    if missing:
        raise UserError(f"{res}: not an optimize result (no {', '.join(missing)})")
    return result


def _without_debug(args: list[str]) -> tuple[bool, list[str]]:
    """Take every `--debug` out of `args` (up to a `--`, after which everything is an argument):
    whether there was one, and the rest, so that `--debug` works before or after the command."""
    end = args.index("--") if "--" in args else len(args)
    head = [a for a in args[:end] if a != "--debug"]
    return len(head) < end, head + args[end:]


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _fail(message: str, code: int) -> None:
    print(f"kernelwright: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


from kernelwright.fuzz.command import fuzz as _fuzz  # noqa: E402 - a command defined beside its package

app.command("fuzz")(_fuzz)


def main():
    """Run the command line and end the process with its exit code (see the module docstring)."""
    _state["debug"], args = _without_debug(sys.argv[1:])
    try:
        code = app(args=args, standalone_mode=False)  # an Exit (Ctrl-C: 130) comes back as its code
    except KeyboardInterrupt:
        code = INTERRUPTED
    except UserError as e:
        if _state["debug"]:
            raise
        _fail(f"error: {e}", 2)
    except typer.Abort:
        _fail("aborted", 1)
    except Exception as e:  # noqa: BLE001
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # click/typer usage errors
            _usage_error(e)
        if _state["debug"]:
            raise
        _fail(f"internal error: {type(e).__name__}: {(str(e).splitlines() or [''])[0]} (rerun with --debug)", 1)
    if code == INTERRUPTED:
        _fail("interrupted", INTERRUPTED)
    sys.exit(code or 0)


def _usage_error(e) -> None:
    """A usage error in one line, exit 2; with no command at all, the help first (on stdout)."""
    if type(e).__name__ == "NoArgsIsHelpError":
        typer.echo(e.format_message())
        _fail("error: missing command (see the usage above)", 2)
    _fail(f"error: {e.format_message()}", 2)
