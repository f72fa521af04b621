"""report.html: one self-contained page from an optimize output's result.json.

The page holds a summary (problem, GPU, versions, precision policy, modes, whole-model times and
speedups, verification, trials and tuning time, coverage), then per training mode the whole-model
times, a roofline against the device's ceilings (`analyze.device`), each unit's times (the library
call, every template's best, the chosen one), the best-so-far curve of each unit's search (from
the trial database, when it holds the unit's trials), a table of the units (strategy, config,
time, GB/s and TFLOP/s against the ceilings, registers, shared memory, spills; with `--ncu` the
Nsight Compute counters of measure/ncu.py) and the generated
kernels' source, highlighted with pygments. Charts are inline SVG (`emit/report_charts.py`), the
style sheet is inline, nothing is fetched. Without times (no CUDA GPU, or a verify-only run) the
page says that nothing was timed and draws no chart.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

from kernelwright.emit import report_charts as charts
from kernelwright.emit.report import tensor_core_unit, unit_flops, unit_tflops

IMPLEMENTATIONS = ("eager", "compile", "kernelwright")  # the whole-model times every timed run has
SKIPPED_KERNELS = ("kw_cuda_runtime.py",)  # shared runtime files beside the kernels (besides _*.py)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.pass { color: #1a7f37; font-weight: bold; } .fail { color: #c62828; font-weight: bold; }
.note { color: #555; font-size: .9em; }
.notimed { background: #fff8e1; border: 1px solid #f0d58c; padding: .6em 1em; border-radius: 4px; }
.chart { margin: .8em 0; } .chart svg { max-width: 100%; height: auto; }
.curves { display: flex; flex-wrap: wrap; gap: 1em; } .curves svg { width: 24em; height: auto; }
.hl { background: #f8f8f8; border: 1px solid #e4e4e4; padding: .5em; overflow-x: auto; font-size: .85em; }
.hl pre { margin: 0; } code { font-size: .9em; }
"""


@dataclass
class Trials:
    """The trial database records of each unit's last search (unit id -> records, oldest first),
    and where they came from (`source`: the database path, or why there are none)."""

    per_unit: dict[str, list[dict]] = field(default_factory=dict)
    source: str = ""
    gpu: str | None = None  # the device name the records were measured on


def load_trials(db_path: str | Path | None, result: dict) -> Trials:
    """Each unit's last search from the trial database at `db_path`: of the records whose task key
    is the unit's (`PROBLEM/UNIT/...`, every template family) and whose precision is the run's, the
    last `trials` ones (the unit's trial count in result.json) in the order they were recorded. A
    missing or unreadable database gives no records and says why in `source`."""
    from kernelwright.search.database import TrialDB

    if db_path is None:
        return Trials(source="no trial database given")
    path = Path(db_path)
    if not path.is_file():
        return Trials(source=f"no trial database at {path}")
    problem, precision = result.get("problem"), result.get("precision")
    units = {g["id"]: g for mode in _mode_records(result).values() for g in mode.get("groups") or []
             if g.get("trials")}
    found: dict[str, list[dict]] = {uid: [] for uid in units}
    try:
        for rec in TrialDB(path):
            key = str(rec.get("task_key", ""))
            if rec.get("precision") != precision or not key.startswith(f"{problem}/"):
                continue
            uid = key[len(problem) + 1:].split("/", 1)[0]
            if uid in found:
                found[uid].append(rec)
    except OSError as e:
        return Trials(source=f"{path}: cannot read ({e.strerror})")
    per_unit, gpus = {}, []
    for uid, recs in found.items():
        recs.sort(key=lambda r: r.get("timestamp") or 0.0)
        last = recs[-int(units[uid]["trials"]):]
        if last:
            per_unit[uid] = last
            gpus += [r.get("device") for r in last if r.get("device")]
    return Trials(per_unit, str(path), max(set(gpus), key=gpus.count) if gpus else None)


def _mode_records(result: dict) -> dict[str, dict]:
    """Training mode -> its record (capture, groups, verify, timing, ...); a result without a
    "modes" map is its own single mode."""
    modes = result.get("modes") or {}
    return modes if modes else {result.get("mode") or "any": result}


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _ms(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def _pct(value, ceiling) -> str:
    return f"{100 * value / ceiling:.0f}%" if value and ceiling else "-"


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """A table of already escaped cells; columns in `numeric` are right-aligned."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _spec(result: dict, trials: Trials):
    """The DeviceSpec the page measures against: the GPU result.json or the trials name, else the
    one `device_spec()` gives here (this machine's GPU, else the H200 entry)."""
    from kernelwright.analyze.device import device_spec
    from kernelwright.errors import UserError

    for name in (result.get("gpu"), trials.gpu):
        if name:
            try:
                return device_spec(name)
            except UserError:
                pass
    return device_spec()


def _timed(record: dict) -> bool:
    t = record.get("timing") or {}
    return any(isinstance(t.get(k), dict) and t[k].get("median_ms") for k in IMPLEMENTATIONS) or any(
        g.get("time_ms") is not None for g in record.get("groups") or [])


def _ceilings(spec, precision: str) -> list[charts.Ceiling]:
    out = [charts.Ceiling("fp32", spec.fp32_tflops)]
    if precision in ("tf32", "bf16") and spec.peak_tflops(precision) != spec.fp32_tflops:
        out.append(charts.Ceiling(f"{precision} tensor cores", spec.peak_tflops(precision)))
    return out


def _summary(result: dict, spec, trials: Trials) -> str:
    """The summary table: what was run, on what, how it compares, how it was checked and searched."""
    from kernelwright import __version__

    modes = _mode_records(result)
    rows: list[tuple[str, str]] = [("problem", f"<b>{_esc(result.get('problem'))}</b> <code>{_esc(result.get('path', ''))}</code>")]
    device = _esc(result.get("device")) + (" (SMALL shapes)" if result.get("small") else "")
    rows.append(("device", device))
    gpu = result.get("gpu") or trials.gpu
    rows.append(("GPU", _esc(gpu) if gpu else "not recorded in result.json"
                 + ("" if result.get("device") == "cpu" else f" (ceilings of {_esc(spec.name)})")))
    rows.append(("ceilings", f"{_esc(spec.name)} ({_esc(spec.source)}): {spec.mem_bw_gbs:.0f} GB/s, fp32 "
                 f"{spec.fp32_tflops:g}, tf32 {spec.tf32_tflops:g}, bf16 {spec.bf16_tflops:g} TFLOP/s"
                 + (f" <span class='note'>{_esc(spec.note)}</span>" if spec.note else "")))
    versions = result.get("versions")
    rows.append(("versions", ", ".join(f"{_esc(k)} {_esc(v)}" for k, v in versions.items()) if isinstance(versions, dict)
                 else f"not recorded in result.json; rendered by kernelwright {_esc(__version__)}"))
    rows.append(("precision policy", f"<b>{_esc(result.get('precision'))}</b> (eager and torch.compile timed under the same policy)"))
    names = ["one forward for train and eval (the result does not depend on the mode)" if m == "any" else m
             for m in modes]
    untuned = result.get("untuned_modes") or []
    rows.append(("modes", _esc(", ".join(names)) + (f"; not generated: {_esc(', '.join(untuned))}" if untuned else "")))
    for mode, rec in modes.items():
        label = "" if len(modes) == 1 else f" ({'train and eval' if mode == 'any' else mode})"
        rows.append((f"times{label}", _times_line(rec)))
        rows.append((f"verification{label}", _verify_line(rec)))
    n_trials = sum(g.get("trials") or 0 for rec in modes.values() for g in rec.get("groups") or [])
    n_failed = sum(g.get("failed") or 0 for rec in modes.values() for g in rec.get("groups") or [])
    seconds = result.get("seconds")
    rows.append(("trials and tuning time", f"{n_trials} trials ({n_failed} failed)"
                 + (f", the whole run {seconds:.1f} s" if isinstance(seconds, (int, float)) else "")))
    cov = (result.get("analysis") or {}).get("coverage")
    if cov:
        rows.append(("coverage", f"generated kernels {100 * cov['generated_bytes']:.0f}% of bytes, "
                     f"{100 * cov['generated_flops']:.0f}% of FLOPs; library calls {100 * cov['library_bytes']:.0f}% "
                     f"of bytes, {100 * cov['library_flops']:.0f}% of FLOPs"))
    return "<h2>Summary</h2><table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _times_line(rec: dict) -> str:
    t = rec.get("timing") or {}
    parts = [f"{k} {_ms(t[k]['median_ms'])} ms" for k in IMPLEMENTATIONS if isinstance(t.get(k), dict)]
    if not parts:
        return "not timed"
    speed = [f"<b>{t[f'speedup_vs_{b}']:.2f}x</b> over {b}" for b in ("eager", "compile") if f"speedup_vs_{b}" in t]
    errors = t.get("errors") or {}
    return (_esc(", ".join(parts)) + " (medians)" + ("; " + ", ".join(speed) if speed else "")
            + "".join(f"<br><span class='fail'>{_esc(k)}: {_esc(v)}</span>" for k, v in errors.items()))


def _verify_line(rec: dict) -> str:
    v = rec.get("verify") or {}
    if v.get("skipped"):
        return f"not needed ({_esc(v['skipped'])})"
    if not v:
        return "not run"
    ok = v.get("passed")
    text = (f"<span class='{'pass' if ok else 'fail'}'>{'PASS' if ok else 'FAIL'}</span>, excess over allclose "
            f"{_esc(v.get('excess'))} (eager: {_esc(v.get('eager_excess'))}, threshold {_esc(v.get('threshold'))})")
    if v.get("reason"):
        text += f": <span class='fail'>{_esc(v['reason'])}</span>"
    for key, why in (("verify_fallback", "failed verification"), ("whole_model_fallback", "was slower than eager")):
        if rec.get(key):
            text += f"<br><span class='fail'>the generated forward {why}: ModelNew runs the original forward</span>"
    return text


def _not_timed(result: dict) -> str:
    why = ("no CUDA GPU: the kernels ran in the Triton interpreter and were verified; timing needs a GPU"
           if result.get("device") == "cpu" else "the run verified its kernels without timing them")
    return f"<p class='notimed'><b>Nothing was timed</b> ({_esc(why)}), so there are no charts.</p>"


def _model_chart(rec: dict) -> str:
    t = rec.get("timing") or {}
    bars = [(k, t[k]["median_ms"], k.split(":")[0]) for k in t
            if isinstance(t.get(k), dict) and isinstance(t[k].get("median_ms"), (int, float))]
    if not bars:
        return ""
    rows = [(name, [(name, ms, colour)]) for name, ms, colour in bars]
    return "<div class='chart'>" + charts.bars_svg("whole model (median per call)", rows) + "</div>"


def _roofline(rec: dict, spec, precision: str) -> str:
    """The roofline chart of one mode, with the units result.json gives no FLOP count for listed."""
    points, left_out = [], []
    cost = rec.get("captured_cost") or {}
    t = rec.get("timing") or {}
    if cost.get("flops") and cost.get("bytes"):
        for k in IMPLEMENTATIONS:
            ms = (t.get(k) or {}).get("median_ms")
            if ms:
                points.append(charts.RoofPoint(f"{k} (model)", cost["flops"] / cost["bytes"],
                                               cost["flops"] / (ms * 1e-3) / 1e12, k))
    for g in rec.get("groups") or []:
        flops, ms = unit_flops(g), g.get("time_ms")
        if flops and ms and g.get("bytes"):
            points.append(charts.RoofPoint(g["id"], flops / g["bytes"], flops / (ms * 1e-3) / 1e12))
        elif ms:
            left_out.append(f"{_esc(g['id'])} ({g['gbps']:.0f} GB/s, {_pct(g['gbps'], spec.mem_bw_gbs)} of the memory "
                            "ceiling)" if g.get("gbps") else _esc(g["id"]))
    if not points:
        return ""
    text = ("<div class='chart'>" + charts.roofline_svg(points, spec.mem_bw_gbs, _ceilings(spec, precision), spec.name)
            + "</div><p class='note'>Squares: the whole model under each implementation, at the FLOPs and minimum "
            "bytes of the captured graph; circles: units with a FLOP count.")
    if left_out:
        text += " Timed units result.json gives no FLOP count for, so not on the chart: " + ", ".join(left_out) + "."
    return text + "</p>"


def _unit_bars(rec: dict) -> str:
    rows = []
    for g in rec.get("groups") or []:
        bars = [(c["choice"], c["time_ms"], "library" if c["choice"] == "library" else "other")
                for c in g.get("choices") or [] if isinstance(c.get("time_ms"), (int, float))]
        if not bars and isinstance(g.get("library_ms"), (int, float)):
            bars.append(("library", g["library_ms"], "library"))
        if isinstance(g.get("time_ms"), (int, float)):
            bars.append((f"chosen ({g.get('strategy')})", g["time_ms"], "chosen"))
        if bars:
            rows.append((g["id"], bars))
    if not rows:
        return ""
    return ("<div class='chart'>" + charts.bars_svg("each unit: the library call, every template's best, the chosen one",
                                                    rows) + "</div>")


def _curves(rec: dict, trials: Trials) -> str:
    """The best-so-far curve of each searched unit, or why there is none."""
    searched = [g for g in rec.get("groups") or [] if g.get("trials")]
    if not searched:
        return "<p class='note'>No unit was searched by trials.</p>"
    svgs, missing = [], []
    for g in searched:
        recs = trials.per_unit.get(g["id"])
        if not recs:
            missing.append(g["id"])
            continue
        times = [r.get("time_ms") if r.get("error") is None else None for r in recs]
        svgs.append(charts.search_curve_svg(f"{g['id']}: {len(recs)} trials", times, g.get("library_ms")))
    text = f"<div class='curves'>{''.join(svgs)}</div>" if svgs else ""
    if svgs:
        text += (f"<p class='note'>Each unit's last trials in the trial database {_esc(trials.source)}, in the order "
                 "they ran (result.json counts the trials; the database holds their times).</p>")
    if missing:
        text += (f"<p class='note'>No search curve for {_esc(', '.join(missing))}: result.json records each template's "
                 f"best time only ({_esc(trials.source or 'no trial database')}); "
                 "<code>kernelwright report DIR --db PATH</code> reads the trials from the database the run wrote.</p>")
    return text


def _units_table(rec: dict, spec, precision: str) -> str:
    rows = []
    profiled = any(g.get("ncu") for g in rec.get("groups") or [])
    for g in rec.get("groups") or []:
        r = g.get("resources") or {}
        cfg = ", ".join(f"{k}={v}" for k, v in (g.get("config") or {}).items()) or "-"
        ms = g.get("time_ms")
        tflops = unit_tflops(g, ms)
        peak = spec.peak_tflops(precision, tensor_core_unit(g))
        backend = next((c["choice"] for c in g.get("choices") or []
                        if c.get("time_ms") is not None and c.get("time_ms") == ms), "-")
        rows.append([_esc(g["id"]), _esc(g.get("kind")), _esc(" ".join(g.get("ops") or [])), _esc(g.get("strategy")),
                     _esc(backend), f"<code>{_esc(cfg)}</code>", _ms(ms), _ms(g.get("library_ms")),
                     f"{g['gbps']:.0f}" if g.get("gbps") else "-", _pct(g.get("gbps"), spec.mem_bw_gbs),
                     f"{tflops:.2f}" if tflops else "-", _pct(tflops, peak),
                     _esc(r.get("registers", "-")), _esc(r.get("shared_bytes", "-")), _esc(r.get("spills", "-")),
                     f"{g.get('trials', 0)} ({g.get('failed', 0)} failed)", _esc(g.get("note") or "")])
        if profiled:
            rows[-1][-2:-2] = _ncu_cells(g.get("ncu") or {})
    if not rows:
        return "<p>No units: the captured graph left nothing to generate.</p>"
    header = ["unit", "kind", "ops", "strategy", "implementation", "config", "ms", "library ms", "GB/s", "% bw",
              "TFLOP/s", "% peak", "registers", "shared bytes", "spills", "trials", "note"]
    numeric = set(range(6, 15))
    if profiled:
        header[-2:-2] = NCU_COLUMNS
        numeric |= set(range(15, 15 + len(NCU_COLUMNS)))
    return _table(header, rows, numeric=numeric)


NCU_COLUMNS = ["ncu us", "occupancy", "DRAM", "bank conflicts ld / st"]  # with --ncu (measure/ncu.py)


def _ncu_cells(n: dict) -> list[str]:
    """A unit's Nsight Compute counters as table cells: duration per call, achieved occupancy, DRAM
    throughput, shared-memory bank conflicts of loads / stores per call."""
    def num(v, fmt):
        return fmt.format(v) if isinstance(v, (int, float)) else "-"

    return [num(n.get("duration_us"), "{:.2f}"), num(n.get("occupancy_pct"), "{:.0f}%"), num(n.get("dram_pct"), "{:.0f}%"),
            f"{num(n.get('bank_conflicts_ld'), '{:.0f}')} / {num(n.get('bank_conflicts_st'), '{:.0f}')}"]


def _ncu_note(result: dict, name: str) -> str:
    """The Nsight Compute line under the mode's units table: what was profiled, or why nothing was."""
    from kernelwright.measure.ncu import summary_line

    line = summary_line(result)
    if line is None:
        return ""
    mode = (result.get("ncu") or {}).get("mode")
    if mode and mode != name and (result.get("ncu") or {}).get("status") == "ok":
        line = f"Nsight Compute: profiled in {mode} mode only"
    return f"<p class='note'>{_esc(line)}</p>"


def _mode_section(name: str, rec: dict, result: dict, spec, trials: Trials, several: bool) -> str:
    title = f"{'train and eval' if name == 'any' else name} mode" if several else "Results"
    parts = [f"<h2>{_esc(title)}</h2>"]
    if rec.get("capture") not in (None, "ok"):
        parts.append(f"<p class='fail'>capture failed: {_esc(rec['capture'])}; ModelNew runs the original forward</p>")
    if _timed(rec):
        precision = result.get("precision", "fp32")
        parts += ["<h3>Whole model</h3>", _model_chart(rec), "<h3>Roofline</h3>",
                  _roofline(rec, spec, precision) or "<p class='note'>Nothing to place: no FLOP counts.</p>",
                  "<h3>Time per unit</h3>", _unit_bars(rec) or "<p class='note'>No unit was timed.</p>",
                  "<h3>Search</h3>", _curves(rec, trials)]
    else:
        parts.append(_not_timed(result))
    parts += ["<h3>Per unit</h3>", _units_table(rec, spec, result.get("precision", "fp32")), _ncu_note(result, name)]
    return "\n".join(parts)


def _highlight(text: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return highlight(text, PythonLexer(), HtmlFormatter(cssclass="hl"))


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(cssclass="hl").get_style_defs(".hl")


def _kernels(folder: Path | None) -> str:
    """The generated kernels of the output folder (kernels/*.py without the shared runtime),
    highlighted; model_new.py folded below them."""
    if folder is None:
        return ""
    parts = ["<h2>Generated kernels</h2>"]
    files = sorted(p for p in (folder / "kernels").glob("*.py")
                   if not p.name.startswith("_") and p.name not in SKIPPED_KERNELS) if (folder / "kernels").is_dir() else []
    for p in files:
        parts.append(f"<h3><code>kernels/{_esc(p.name)}</code></h3>" + _highlight(p.read_text(errors="replace")))
    if not files:
        parts.append("<p class='note'>No kernels/ folder with generated kernels"
                     + (" (a single-file output: they are in model_new.py)" if (folder / "model_new.py").is_file() else "")
                     + ".</p>")
    model = folder / "model_new.py"
    if model.is_file():
        parts.append("<details><summary><code>model_new.py</code></summary>"
                     + _highlight(model.read_text(errors="replace")) + "</details>")
    return "\n".join(parts)


def render_html(result: dict, folder: str | Path | None = None, trials: Trials | None = None, spec=None) -> str:
    """The page for `result` (result.json's content); `folder` (the optimize output) supplies the
    kernel sources, `trials` each unit's search history, `spec` the device ceilings (default: the
    GPU result.json or the trials name, else `device_spec()`)."""
    trials = trials or Trials(source="no trial database given")
    spec = spec or _spec(result, trials)
    folder = Path(folder) if folder is not None else None
    modes = _mode_records(result)
    body = [f"<h1>kernelwright report: {_esc(result.get('problem'))}</h1>", _summary(result, spec, trials)]
    body += [_mode_section(name, rec, result, spec, trials, len(modes) > 1) for name, rec in modes.items()]
    rewrites = result.get("rewrites") or []
    if rewrites:
        body.append("<h2>Rewrites</h2><ul>" + "".join(f"<li>{_esc(r)}</li>" for r in rewrites) + "</ul>")
    body.append(_kernels(folder))
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>kernelwright report: {_esc(result.get('problem'))}</title>"
            f"<style>{CSS}{_pygments_css()}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_html_report(folder: str | Path, result: dict, db_path: str | Path | None = None) -> Path:
    """Write `folder`/report.html for `result`, with the search curves from the trial database at
    `db_path` (None: none); returns the page's path."""
    folder = Path(folder)
    path = folder / "report.html"
    path.write_text(render_html(result, folder, load_trials(db_path, result)), encoding="utf-8")
    return path

