"""The charts of report.html, drawn with matplotlib (Agg canvas, no display) as inline SVG text.

Every function takes plain numbers and returns one `<svg>` element as a string, ready to be
placed in a page: text stays text (searchable, no fonts embedded), no external references, no
creation date (the same input gives the same SVG). matplotlib is imported when a chart is drawn,
so importing this module costs nothing.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

# one colour per implementation, the same on every chart of the page
COLOURS = {"eager": "#8c8c8c", "compile": "#4c72b0", "kernelwright": "#dd8452", "library": "#8c8c8c",
           "chosen": "#dd8452", "other": "#55a868"}


@dataclass(frozen=True)
class RoofPoint:
    """One point of the roofline: `label` at `intensity` FLOP/byte and `tflops` achieved."""

    label: str
    intensity: float
    tflops: float
    kind: str = "unit"  # "unit" or one of the whole-model implementations (COLOURS' keys)


@dataclass(frozen=True)
class Ceiling:
    """A compute roof: `tflops` under `name` (e.g. "fp32 CUDA cores", "tf32 tensor cores")."""

    name: str
    tflops: float


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    fig.set_layout_engine("constrained")
    return fig


def _svg(fig) -> str:
    """The figure as one `<svg>` element (XML prolog and DOCTYPE dropped, text kept as text)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kernelwright"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):].strip()


def roofline_svg(points: list[RoofPoint], mem_gbs: float, ceilings: list[Ceiling], device: str) -> str:
    """A log-log roofline: the memory roof (`mem_gbs` GB/s) meeting each compute roof, and every
    point placed by its arithmetic intensity and achieved TFLOP/s."""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    xs = [p.intensity for p in points if p.intensity > 0] or [1.0]
    top = max(c.tflops for c in ceilings)
    ridge = [c.tflops * 1e3 / mem_gbs for c in ceilings]  # FLOP/byte where each roof starts
    lo = min(min(xs) / 4, min(ridge) / 100)
    hi = max(max(xs) * 4, max(ridge) * 10)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(x * mem_gbs / 1e3, top) for x in grid], color="black", lw=1.5,
            label=f"memory {mem_gbs:.0f} GB/s")
    for c, r in zip(sorted(ceilings, key=lambda c: c.tflops), sorted(ridge)):
        ax.plot([r, hi], [c.tflops, c.tflops], ls="--", lw=1, label=f"{c.name} {c.tflops:g} TFLOP/s")
    for p in points:
        if p.intensity <= 0 or p.tflops <= 0:
            continue
        colour = COLOURS.get(p.kind, COLOURS["other"])
        marker = "o" if p.kind == "unit" else "s"
        if p.kind == "unit":  # units are named beside their point, whole-model points in the legend
            ax.scatter([p.intensity], [p.tflops], color=colour, marker=marker, s=36, zorder=3, edgecolor="black", lw=0.5)
            ax.annotate(p.label, (p.intensity, p.tflops), textcoords="offset points", xytext=(5, 4), fontsize=8)
        else:
            ax.scatter([p.intensity], [p.tflops], color=colour, marker=marker, s=36, zorder=3, edgecolor="black",
                       lw=0.5, label=f"{p.label}: {p.tflops:.3g} TFLOP/s")
    ys = [p.tflops for p in points if p.tflops > 0] or [top]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(max(min(ys) / 10, lo * mem_gbs / 1e3), top * 2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"roofline against {device}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _svg(fig)


def bars_svg(title: str, rows: list[tuple[str, list[tuple[str, float, str]]]], unit: str = "ms") -> str:
    """Horizontal grouped bars: `rows` is [(row label, [(bar label, value, colour key), ...])],
    each row's bars side by side; a value's number is written at the end of its bar."""
    n_bars = max((len(bars) for _, bars in rows), default=1)
    fig = _figure(7.5, 0.9 + 0.28 * sum(len(bars) for _, bars in rows) + 0.2 * len(rows))
    ax = fig.add_subplot()
    height = 0.8 / n_bars
    ticks, names, seen = [], [], set()
    for i, (name, bars) in enumerate(rows):
        y0 = -i
        for j, (label, value, colour) in enumerate(bars):
            y = y0 - j * height
            legend = label if label not in seen else None
            seen.add(label)
            ax.barh([y], [value], height=height * 0.9, color=COLOURS.get(colour, COLOURS["other"]), label=legend)
            ax.annotate(f"{value:.3g} {unit}", (value, y), textcoords="offset points", xytext=(3, -3), fontsize=7)
        ticks.append(y0 - (len(bars) - 1) * height / 2)
        names.append(name)
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_xlabel(unit)
    ax.set_xlim(0, max((v for _, bars in rows for _, v, _ in bars), default=1) * 1.25)
    ax.set_title(title, fontsize=10)
    if n_bars > 1:  # rows of one bar each are named by their tick alone
        ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return _svg(fig)


def search_curve_svg(title: str, times: list[float | None], library_ms: float | None) -> str:
    """One unit's search: each trial's time (a failed trial as a cross at the bottom), the best so
    far after each trial, and the library call's time as a dashed line."""
    fig = _figure(3.6, 2.6)
    ax = fig.add_subplot()
    ok = [(i + 1, t) for i, t in enumerate(times) if t is not None and t > 0]
    best, curve = math.inf, []
    for i, t in enumerate(times):
        if t is not None and t > 0:
            best = min(best, t)
        curve.append(best if math.isfinite(best) else None)
    if ok:
        ax.scatter([i for i, _ in ok], [t for _, t in ok], s=12, color=COLOURS["other"], label="trial", zorder=3)
    steps = [(i + 1, b) for i, b in enumerate(curve) if b is not None]
    if steps:
        ax.step([i for i, _ in steps], [b for _, b in steps], where="post", color=COLOURS["chosen"], label="best so far")
    failed = [i + 1 for i, t in enumerate(times) if t is None or t <= 0]
    if failed:
        floor = min([t for _, t in ok] + ([library_ms] if library_ms else []) or [1.0])
        ax.scatter(failed, [floor] * len(failed), marker="x", color="#c44e52", s=16, label="failed")
    if library_ms:
        ax.axhline(library_ms, ls="--", color=COLOURS["library"], lw=1, label=f"library {library_ms:.3g} ms")
    ax.set_xlabel("trial")
    ax.set_ylabel("ms")
    ax.set_xlim(0.5, max(len(times), 1) + 0.5)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(True, alpha=0.3)
    return _svg(fig)


def histogram_svg(title: str, values: list[float], xlabel: str, mark: float | None = 1.0) -> str:
    """The distribution of `values` (e.g. speedups) on a log axis, with a vertical line at `mark`."""
    fig = _figure(6.0, 3.0)
    ax = fig.add_subplot()
    vals = [v for v in values if v > 0]
    lo, hi = min(vals + [mark or 1.0]), max(vals + [mark or 1.0])
    lo, hi = lo / 1.1, hi * 1.1
    n = max(5, min(30, 2 * len(vals)))
    edges = [lo * (hi / lo) ** (i / n) for i in range(n + 1)]
    ax.hist(vals, bins=edges, color=COLOURS["kernelwright"], edgecolor="black", lw=0.5)
    if mark is not None:
        ax.axvline(mark, color="black", ls="--", lw=1)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of problems
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("problems")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return _svg(fig)
