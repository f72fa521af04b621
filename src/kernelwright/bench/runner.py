"""Run problems one by one (one worker process per visible GPU) and summarise per level.

fast_p (KernelBench): the share of problems that are correct *and* faster than the baseline by
more than p. Geometric means are over problems with a timing on both sides.
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import traceback
from pathlib import Path


def _one(path: str, opts: dict) -> dict:
    """Bench one problem in this process; never raises (errors are rows)."""
    import torch

    from kernelwright.policy import get_policy
    from kernelwright.problem import load_problem

    row = {"problem": Path(path).stem, "path": path, "level": None}
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
            from kernelwright.pipeline import Options, optimize_problem

            out = Path(opts["out_dir"]) / f"level{p.level}" / p.name
            res = optimize_problem(p, out, Options(budget_trials=opts["trials"], budget_s=opts["seconds"],
                                                   precision=opts["precision"], device="cuda", small=opts["small"],
                                                   cuda_graphs=opts.get("cuda_graphs", True),
                                                   compile_mode=opts.get("compile_mode") or "default",
                                                   log=lambda s: None))
            t = res.get("timing") or {}
            row["times"] = {k: v["median_ms"] for k, v in t.items() if isinstance(v, dict) and "median_ms" in v}
            row["issue"] = {k: v.get("issue_ms") for k, v in t.items() if isinstance(v, dict) and "median_ms" in v}
            row["syncs"] = t.get("syncs", {})
            row["errors"] = t.get("errors", {})
            row["correct"] = bool((res.get("verify") or {}).get("passed"))
            row["cuda_graphs"] = t.get("cuda_graphs")
            row["anchor"] = (res.get("analysis") or {}).get("anchor")
            row["groups"] = [(g["id"], g["kind"], g["strategy"]) for g in res.get("groups", [])]
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        row["trace"] = traceback.format_exc(limit=3)
    finally:
        torch.cuda.empty_cache()
    return row


def _worker(gpu: int, paths: list[str], opts: dict, queue):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    for p in paths:
        queue.put(_one(p, opts))
    queue.put(None)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summarise(rows: list[dict], baseline_only: bool) -> dict:
    levels: dict = {}
    for r in rows:
        levels.setdefault(r.get("level"), []).append(r)
    out = {}
    for lvl, rs in sorted(levels.items(), key=lambda kv: (kv[0] is None, kv[0])):
        s = {"n": len(rs)}
        s["compile_over_eager"] = geomean(r["times"]["eager"] / r["times"]["compile"] for r in rs
                                          if "eager" in r.get("times", {}) and "compile" in r.get("times", {}))
        if not baseline_only:
            for base in ("eager", "compile"):
                sp = [r["times"][base] / r["times"]["kernelwright"] for r in rs
                      if r.get("correct") and base in r.get("times", {}) and "kernelwright" in r["times"]]
                s[f"kw_over_{base}"] = geomean(sp)
                s[f"fast_1_{base}"] = sum(1 for x in sp if x > 1.0) / len(rs)
                s[f"fast_2_{base}"] = sum(1 for x in sp if x > 2.0) / len(rs)
            s["correct"] = sum(1 for r in rs if r.get("correct")) / len(rs)
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
              cuda_graphs=True):
    import torch

    opts = dict(baseline_only=baseline_only, precision=precision, trials=trials, seconds=seconds,
                out_dir=str(out_dir), small=small, compile_mode=compile_mode,
                cuda_graphs=cuda_graphs)
    n_gpu = max(1, torch.cuda.device_count())
    paths = [str(f) for f in files]
    rows: list[dict] = []
    echo(f"{len(paths)} problems, {n_gpu} GPU worker(s), precision {precision}, "
         f"{'baselines only' if baseline_only else 'optimize + baselines'}")
    header = f"{'problem':34s} {'eager ms':>9s} {'compile ms':>10s}" + ("" if baseline_only else f" {'kw ms':>9s} {'ok':>3s} {'vs compile':>10s}")
    echo(header)

    def save():
        if json_out:
            Path(json_out).write_text(json.dumps({"rows": rows, "summary": summarise(rows, baseline_only), "options": opts,
                                                  "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
                                                 indent=2, default=str))

    def show(r):
        t = r.get("times", {})
        line = f"{('L' + str(r.get('level')) + ' ' + r['problem'])[:34]:34s} {t.get('eager', float('nan')):9.3f} {t.get('compile', float('nan')):10.3f}"
        if not baseline_only:
            kw = t.get("kernelwright")
            sp = t["compile"] / kw if kw and "compile" in t else float("nan")
            line += f" {kw or float('nan'):9.3f} {'yes' if r.get('correct') else 'NO':>3s} {sp:10.2f}"
        if r.get("error"):
            line += f"  ERROR {r['error'][:80]}"
        echo(line)

    if n_gpu == 1:
        for p in paths:
            r = _one(p, opts)
            rows.append(r)
            show(r)
            save()
    else:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(g, paths[g::n_gpu], opts, q)) for g in range(n_gpu)]
        for pr in procs:
            pr.start()
        done = 0
        while done < n_gpu:
            r = q.get()
            if r is None:
                done += 1
                continue
            rows.append(r)
            show(r)
            save()
        for pr in procs:
            pr.join()
    summary = summarise(rows, baseline_only)
    for lvl, s in summary.items():
        echo(f"{lvl}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    save()
    return rows, summary
