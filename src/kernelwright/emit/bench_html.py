"""bench.html: one self-contained page from a benchmark's rows and summary (the bench JSON).

Per level: the geometric means over eager and torch.compile, KernelBench's fast_p (the share of the
level's problems that are correct and faster than the baseline, by more than 1x and 2x), the
share correct; then every problem's times, and the distribution of kernelwright's speedups over
torch.compile and eager as inline SVG (`emit/report_charts.py`). A baseline-only run, or one
without kernelwright times, says so instead of drawing the distribution.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

from kernelwright.emit import report_charts as charts
from kernelwright.emit.report_html import CSS

BASES = ("eager", "compile")


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value, fmt: str = "{:.3f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def speedups(rows: list[dict], base: str) -> list[float]:
    """kernelwright's speedup over `base` of every correct row that has both times."""
    out = []
    for r in rows:
        t = r.get("times") or {}
        if r.get("correct") and t.get(base) and t.get("kernelwright"):
            out.append(t[base] / t["kernelwright"])
    return out


def _level_table(summary: dict) -> str:
    header = ["level", "n", "correct", "kw / eager", "kw / compile", "fast_1 eager", "fast_2 eager", "fast_1 compile",
              "fast_2 compile", "compile / eager"]
    rows = []
    for level, s in summary.items():
        pct = lambda k: _num(100 * s[k], "{:.0f}%") if isinstance(s.get(k), (int, float)) else "-"  # noqa: E731
        rows.append([_esc(level), _esc(s.get("n")), pct("correct"), _num(s.get("kw_over_eager")),
                     _num(s.get("kw_over_compile")), pct("fast_1_eager"), pct("fast_2_eager"), pct("fast_1_compile"),
                     pct("fast_2_compile"), _num(s.get("compile_over_eager"))])
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if i else f"<td>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _status(r: dict) -> str:
    if r.get("error"):
        return f"<span class='fail'>error</span>: {_esc(r['error'])}"
    if r.get("correct") is None:
        return "baselines only"
    if not r.get("correct"):
        return "<span class='fail'>wrong</span>"
    return "correct" + (f" (original forward kept: {_esc(r['fallback'])})" if r.get("fallback") else "")


def _problem_table(rows: list[dict]) -> str:
    header = ["problem", "eager ms", "compile ms", "kernelwright ms", "vs eager", "vs compile", "result"]
    cells = []
    for r in sorted(rows, key=lambda r: r.get("problem", "")):
        t = r.get("times") or {}
        kw = t.get("kernelwright")
        sp = {b: t[b] / kw if kw and t.get(b) else None for b in BASES}
        cells.append([_esc(r.get("problem")), _num(t.get("eager")), _num(t.get("compile")), _num(kw),
                      _num(sp["eager"], "{:.2f}x"), _num(sp["compile"], "{:.2f}x"), _status(r)])
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if 0 < i < 6 else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in cells)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_bench_html(bench: dict) -> str:
    """The page for `bench` (the bench JSON: "rows", "summary", "options", "gpu", "torch")."""
    rows, summary, opts = bench.get("rows") or [], bench.get("summary") or {}, bench.get("options") or {}
    body = ["<h1>kernelwright benchmark</h1>", "<table>"]
    facts = [("GPU", bench.get("gpu") or "not recorded"), ("torch", bench.get("torch") or "not recorded"),
             ("precision policy", opts.get("precision", "-")), ("problems", len(rows)),
             ("run", "baselines only" if opts.get("baseline_only") else
              f"optimize + baselines, budget {opts.get('trials') or '-'} trials"
              + (f" / {opts['seconds']:g} s" if opts.get("seconds") else "")),
             ("torch.compile mode", opts.get("compile_mode", "default"))]
    body += [f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in facts] + ["</table>"]
    body += ["<h2>Per level</h2>", _level_table(summary),
             "<p class='note'>Geometric means of kernelwright's speedup over each baseline on the correct problems; "
             "fast_p: the share of all the level's problems that are correct and more than p times faster.</p>"]
    body.append("<h2>Speedups</h2>")
    drawn = False
    for base in ("compile", "eager"):
        sp = speedups(rows, base)
        if sp:
            drawn = True
            body.append("<div class='chart'>" + charts.histogram_svg(
                f"kernelwright over {'torch.compile' if base == 'compile' else base}: {len(sp)} problems",
                sp, f"speedup over {base} (x)") + "</div>")
    if not drawn:
        body.append("<p class='notimed'><b>No kernelwright times</b>"
                    + (" (a baseline-only run)" if opts.get("baseline_only") else "") + ", so no distribution.</p>")
    levels: dict = {}
    for r in rows:
        levels.setdefault(r.get("level"), []).append(r)
    for level, rs in sorted(levels.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        body += [f"<h2>Level {_esc(level)}</h2>", _problem_table(rs)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>kernelwright benchmark</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_bench_report(folder: str | Path, bench: dict) -> Path:
    """Write `folder`/bench.html (the folder made if needed); returns the page's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench.html"
    path.write_text(render_bench_html(bench), encoding="utf-8")
    return path
