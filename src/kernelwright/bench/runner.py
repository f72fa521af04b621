"""Run problems one by one (one worker process per visible GPU, or the workers of a Dask cluster:
bench/cluster.py) and summarise per level; a worker that a hung kernel ends is restarted (the
problem runs once more, without the hung candidate). On the CPU (`device` "cpu") each problem is
optimized untimed, its kernels in Triton's interpreter: the rows say what verified, not how fast.

fast_p (KernelBench): the share of problems that are correct *and* faster than the baseline by
more than p. Geometric means are over problems with a timing on both sides.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_for
from pathlib import Path

from kernelwright.measure.watchdog import HANG_EXIT_CODE
from kernelwright.problem.load import level_of


def _one(path: str, opts: dict) -> dict:
    """Bench one problem in this process; never raises (errors are rows)."""
    import torch

    from kernelwright.policy import get_policy
    from kernelwright.problem import load_problem

    row = {"problem": Path(path).stem, "path": path, "level": None}
    start = time.perf_counter()
    try:
        p = load_problem(path, small=opts["small"])
        row["level"] = p.level
        policy = get_policy(opts["precision"])
        if opts["baseline_only"]:
            from kernelwright.measure.baselines import time_problem

            t = time_problem(p, policy, "cuda", compile_mode=opts["compile_mode"])
            row["times"] = {k: v.median_ms for k, v in t.items()}
            row["issue"] = {k: v.issue_ms for k, v in t.items()}
            row["errors"] = dict(t.errors)
            row["correct"] = None
        else:
            out = Path(opts["out_dir"]) / f"level{p.level}" / p.name
            res = _optimize(p, out, opts, opts.get("no_rewrites", False))
            t = res.get("timing") or {}
            row["times"] = {k: v["median_ms"] for k, v in t.items() if isinstance(v, dict) and "median_ms" in v}
            row["issue"] = {k: v.get("issue_ms") for k, v in t.items() if isinstance(v, dict) and "median_ms" in v}
            row["syncs"] = t.get("syncs", {})
            row["errors"] = t.get("errors", {})
            row["correct"] = bool((res.get("verify") or {}).get("passed"))
            if res.get("verify_fallback"):  # correct, but only because the original forward shipped
                row["fallback"] = f"generated program failed verification: {res['verify_fallback'].get('reason')}"
            row["cuda_graphs"] = t.get("cuda_graphs")
            row["anchor"] = (res.get("analysis") or {}).get("anchor")
            row["groups"] = [(g["id"], g["kind"], g["strategy"]) for g in res.get("groups", [])]
            row["modes"] = {m: _mode_row(r) for m, r in (res.get("modes") or {}).items()}
            row["memory"] = res.get("memory")
            row["stages"] = res.get("stages")  # optimize's wall seconds per stage
            if opts.get("rewrites_ab") and not opts.get("no_rewrites"):
                _without_rewrites(p, out, opts, res, row)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        row["trace"] = traceback.format_exc(limit=3)
    finally:
        torch.cuda.empty_cache()
        row["wall_s"] = round(time.perf_counter() - start, 2)  # load, optimize (or baselines), all timing
    return row


def _progress_log(out: Path):
    """A log function appending each line, with the seconds since this call, to `out`'s sibling
    NAME.progress.log as the optimize goes: where a problem is cut by a time limit, the file says
    how far it came and which units took the time."""
    path = out.parent / f"{out.name}.progress.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    start = time.perf_counter()

    def log(line: str) -> None:
        with open(path, "a") as f:
            f.write(f"[{time.perf_counter() - start:7.1f} s] {line}\n")
    return log


def _optimize(p, out: Path, opts: dict, no_rewrites: bool) -> dict:
    from kernelwright.pipeline import Options, optimize_problem

    device = opts.get("device", "cuda")
    return optimize_problem(p, out, Options(budget_trials=opts["trials"], budget_s=opts["seconds"],
                                            precision=opts["precision"], device=device, small=opts["small"],
                                            db_path=opts.get("db_path"),
                                            cuda_graphs=opts.get("cuda_graphs", True),
                                            compile_mode=opts.get("compile_mode") or "default",
                                            mode=opts.get("mode", "both"),
                                            timed=opts.get("timed", True) and device == "cuda",
                                            no_library=opts.get("no_library", False), no_rewrites=no_rewrites,
                                            retune=True,  # a benchmark times the whole search
                                            log=_progress_log(out)))


def algebra_rules(res: dict) -> list[dict]:
    """The exact-algebra rules (plan/algebra.py) an optimize result applied, in any training mode."""
    from kernelwright.plan.algebra import parse_note

    lines = list(res.get("rewrites") or []) + [x for r in (res.get("modes") or {}).values() for x in r.get("rewrites") or []]
    return [n for n in map(parse_note, dict.fromkeys(lines)) if n is not None]


def _without_rewrites(p, out: Path, opts: dict, res: dict, row: dict) -> None:
    """bench --rewrites-ab: the problem's time without the exact algebra as well. Where a rule applied
    the problem is optimized again with no_rewrites (into out/no_rewrites); where none did, the
    program without them is the same graph, so its time is the one just measured."""
    rules = algebra_rules(res)
    row["rules"] = sorted({r["rule"] for r in rules})
    if not rules:
        if "kernelwright" in row["times"]:
            row["times"]["kernelwright:no_rewrites"] = row["times"]["kernelwright"]
        row["correct_no_rewrites"] = row["correct"]
        return
    again = _optimize(p, out / "no_rewrites", opts, True)
    t = again.get("timing") or {}
    if isinstance(t.get("kernelwright"), dict) and "median_ms" in t["kernelwright"]:
        row["times"]["kernelwright:no_rewrites"] = t["kernelwright"]["median_ms"]
        if "compile" in t:
            row["times"]["compile:no_rewrites_run"] = t["compile"]["median_ms"]
    row["correct_no_rewrites"] = bool((again.get("verify") or {}).get("passed"))


def _mode_row(record: dict) -> dict:
    """One training mode's outcome: verified, whether the generated forward shipped, its times."""
    t = record.get("timing") or {}
    return {"correct": bool((record.get("verify") or {}).get("passed")),
            "generated": not (record.get("verify_fallback") or record.get("whole_model_fallback")
                              or record.get("capture") != "ok"),
            "excess": (record.get("verify") or {}).get("excess"),
            "times": {k: v["median_ms"] for k, v in t.items() if isinstance(v, dict) and "median_ms" in v}}


def _exit_with_parent(parent: int, every_s: float = 0.5) -> None:
    """End this worker once the bench that started it is gone (killed by a time limit, say): an
    orphan would go on using the GPU under whatever runs next."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def _worker(gpu: int, paths: list[str], opts: dict, conn, one=None):
    """Bench `paths` in order on GPU `gpu`, sending one row per problem through `conn`, then None.
    (A pipe, not a queue: its send is written before the next problem starts, so a row is never
    lost when a hung kernel later ends this process with os._exit.)"""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    one = one or _one
    try:
        for p in paths:
            conn.send(one(p, opts))
        conn.send(None)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the bench reports it, once
        os._exit(130)
    conn.close()


def _died_row(path: str, code) -> dict:
    if code == HANG_EXIT_CODE:
        why = ("hang: a candidate kernel never finished on the GPU or faulted it, twice (each recorded in "
               "the trial database as failed and left out of later runs)")
    else:
        why = f"crash: the worker process died (exit code {code})"
    return {"problem": Path(path).stem, "path": path, "level": level_of(path), "correct": False, "error": why}


def run_workers(groups: list[list[str]], opts: dict, on_row, *, one=None) -> None:
    """Bench each list in `groups` in its own worker process (list i on GPU i); `on_row(row)` as rows
    arrive. A worker that dies inside a problem is restarted on the rest of its list: after a hung
    kernel ended it (exit code HANG_EXIT_CODE; the candidate is then recorded, measure/watchdog.py)
    the problem runs once more, without that candidate; otherwise, or when it hangs again, the
    problem becomes an error row. `one(path, opts) -> row` benches one problem (default `_one`)."""
    ctx = mp.get_context("spawn")
    todo = {g: list(paths) for g, paths in enumerate(groups) if paths}
    procs: dict = {}  # gpu -> (process, read end of its pipe)
    hangs: dict[str, int] = {}

    def start(g):
        reader, writer = ctx.Pipe(duplex=False)
        pr = ctx.Process(target=_worker, args=(g, todo[g], opts, writer, one))
        pr.start()
        writer.close()  # the child holds the write end: its exit ends the pipe (EOFError below)
        procs[g] = (pr, reader)

    for g in todo:
        start(g)
    while procs:
        readers = {reader: g for g, (_, reader) in procs.items()}
        for reader in wait_for(list(readers)):
            g = readers[reader]
            pr = procs[g][0]
            try:
                row = reader.recv()
            except EOFError:  # the worker died inside todo[g][0]
                pr.join()
                reader.close()
                del procs[g]
                path = todo[g][0]
                hangs[path] = hangs.get(path, 0) + (pr.exitcode == HANG_EXIT_CODE)
                if pr.exitcode != HANG_EXIT_CODE or hangs[path] > 1:
                    on_row(_died_row(path, pr.exitcode))
                    todo[g].pop(0)
                if todo[g]:
                    start(g)
                continue
            if row is None:
                pr.join()
                reader.close()
                del procs[g]
            else:
                todo[g].pop(0)
                on_row(row)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summarise(rows: list[dict], baseline_only: bool, timed: bool = True) -> dict:
    """Per level: problem count, median wall time, and (unless `baseline_only`) the share that
    verified; with `timed`, the geometric means of the speedups and fast_p as well."""
    levels: dict = {}
    for r in rows:
        levels.setdefault(r.get("level"), []).append(r)
    out = {}
    for lvl, rs in sorted(levels.items(), key=lambda kv: (kv[0] is None, kv[0])):
        s = {"n": len(rs)}
        walls = sorted(r["wall_s"] for r in rs if r.get("wall_s") is not None)
        s["wall_s_median"] = walls[len(walls) // 2] if walls else None  # seconds per problem, end to end
        if timed:
            s["compile_over_eager"] = geomean(r["times"]["eager"] / r["times"]["compile"] for r in rs
                                              if "eager" in r.get("times", {}) and "compile" in r.get("times", {}))
        if not timed:
            s["correct"] = sum(1 for r in rs if r.get("correct")) / len(rs)
        elif not baseline_only:
            for base in ("eager", "compile"):
                sp = [r["times"][base] / r["times"]["kernelwright"] for r in rs
                      if r.get("correct") and base in r.get("times", {}) and "kernelwright" in r["times"]]
                s[f"kw_over_{base}"] = geomean(sp)
                s[f"fast_1_{base}"] = sum(1 for x in sp if x > 1.0) / len(rs)
                s[f"fast_2_{base}"] = sum(1 for x in sp if x > 2.0) / len(rs)
            s["correct"] = sum(1 for r in rs if r.get("correct")) / len(rs)
            both = [r for r in rs if r.get("correct") and r.get("correct_no_rewrites") and "compile" in r.get("times", {})
                    and "kernelwright" in r["times"] and "kernelwright:no_rewrites" in r["times"]]
            if both:  # bench --rewrites-ab: the same problems with and without the exact algebra
                s["kw_over_compile_rewrites_ab"] = [
                    len(both), geomean(r["times"]["compile"] / r["times"]["kernelwright"] for r in both),
                    geomean(r["times"]["compile"] / r["times"]["kernelwright:no_rewrites"] for r in both)]
            # per anchor (conv / gemm / none: analyze.classify.anchor), e.g. level 2's conv + epilogue
            # and GEMM + epilogue problems: anchor -> [n, kw over compile (geomean)]
            by: dict = {}
            for r in rs:
                t = r.get("times", {})
                if r.get("anchor") and r.get("correct") and "compile" in t and "kernelwright" in t:
                    by.setdefault(r["anchor"], []).append(t["compile"] / t["kernelwright"])
            s["kw_over_compile_by_anchor"] = {a: [len(xs), geomean(xs)] for a, xs in sorted(by.items())}
        out[f"level{lvl}"] = s
    return out


def run_bench(files, baseline_only, precision, trials, seconds, json_out, out_dir, small, compile_mode, echo,
              cuda_graphs=True, mode="both", timed=True, no_library=False, no_rewrites=False, rewrites_ab=False,
              device="cuda", cluster=None, db_path=None):
    """Bench `files`: on the GPUs of this host (one worker process each), or with `cluster` (a
    `--cluster` value: local:N or a scheduler's address) on the workers of a Dask cluster, whose
    trials come back with each row and go into the trial database `db_path` here. `device` "cpu":
    optimize untimed, report verification only."""
    import torch

    on_gpu = device == "cuda"
    opts = dict(baseline_only=baseline_only, precision=precision, trials=trials, seconds=seconds,
                out_dir=str(out_dir), small=small, compile_mode=compile_mode,
                cuda_graphs=cuda_graphs, mode=mode, timed=timed and on_gpu, no_library=no_library,
                no_rewrites=no_rewrites, rewrites_ab=rewrites_ab, device=device, db_path=db_path)
    n_gpu = max(1, torch.cuda.device_count()) if on_gpu else 1
    paths = [str(f) for f in files]
    rows: list[dict] = []
    where = f"cluster {cluster}" if cluster else (f"{n_gpu} GPU worker(s)" if on_gpu else "1 CPU worker")
    what = ("baselines only" if baseline_only else "optimize + baselines") if opts["timed"] or baseline_only \
        else "optimize, verification only (untimed)"
    echo(f"{len(paths)} problems, {where}, precision {precision}, {what}")
    timed_rows = baseline_only or opts["timed"]
    if timed_rows:
        header = f"{'problem':34s} {'eager ms':>9s} {'compile ms':>10s}" + ("" if baseline_only else f" {'kw ms':>9s} {'ok':>3s} {'vs compile':>10s}")
    else:
        header = f"{'problem':34s} {'ok':>3s} {'units':>5s} {'wall s':>7s}"
    echo(header)

    def save():
        if json_out:
            Path(json_out).write_text(json.dumps({"rows": rows, "summary": summarise(rows, baseline_only, timed_rows),
                                                  "options": opts,
                                                  "gpu": torch.cuda.get_device_name(0) if on_gpu else "cpu",
                                                  "torch": torch.__version__},
                                                 indent=2, default=str))

    def show(r):
        t = r.get("times", {})
        name = f"{('L' + str(r.get('level')) + ' ' + r['problem'])[:34]:34s}"
        ok = ("fb" if r.get("fallback") else "yes") if r.get("correct") else "NO"
        if not timed_rows:
            line = f"{name} {ok:>3s} {len(r.get('groups') or []):5d} {r.get('wall_s') or float('nan'):7.1f}"
        else:
            line = f"{name} {t.get('eager', float('nan')):9.3f} {t.get('compile', float('nan')):10.3f}"
        if timed_rows and not baseline_only:
            kw = t.get("kernelwright")
            sp = t["compile"] / kw if kw and "compile" in t else float("nan")
            line += f" {kw or float('nan'):9.3f} {ok:>3s} {sp:10.2f}"
        if r.get("rules"):
            nr = t.get("kernelwright:no_rewrites")
            line += f"  without {'+'.join(r['rules'])}: " + (f"{t['compile'] / nr:.2f}" if nr and "compile" in t else "-")
        if r.get("error"):
            line += f"  ERROR {r['error'][:80]}"
        echo(line)

    def add(r):
        rows.append(r)
        show(r)
        save()

    if cluster:
        from kernelwright.bench.cluster import run_cluster

        run_cluster(cluster, paths, opts, add, db_path=db_path, echo=echo)
    else:
        run_workers([paths[g::n_gpu] for g in range(n_gpu)], opts, add)
    summary = summarise(rows, baseline_only, timed_rows)
    for lvl, s in summary.items():
        echo(f"{lvl}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    save()
    return rows, summary
