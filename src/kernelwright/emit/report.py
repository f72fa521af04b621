"""report.md: what was generated, how it compares with eager and torch.compile, kernel by kernel."""
from __future__ import annotations

import re
from pathlib import Path


def _ms(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def _pct_bw(gbps, spec_bw) -> str:
    return f"{100 * gbps / spec_bw:.0f}%" if gbps and spec_bw else "-"


def _kernel_lines(per_impl: dict, top: int = 8) -> list[str]:
    """Each implementation's kernels per call (device time from torch.profiler), longest first."""
    lines = ["", "## Kernels per call", "",
             "Device time of every kernel each implementation launches per call (torch.profiler, 10 calls, "
             "each after an L2 flush); read it beside compile's to see which pass costs what.", ""]
    for impl, rows in per_impl.items():
        total = sum(r["us_per_call"] for r in rows)
        launches = sum(r["launches_per_call"] for r in rows)
        lines += [f"**{impl}**: {total:.1f} us in {launches:g} launches", "",
                  "| us | launches | kernel |", "|---:|---:|---|"]
        for r in rows[:top]:
            lines.append(f"| {r['us_per_call']:.1f} | {r['launches_per_call']:g} | `{r['name'].replace('|', '/')}` |")
        rest = rows[top:]
        if rest:
            lines.append(f"| {sum(r['us_per_call'] for r in rest):.1f} | {sum(r['launches_per_call'] for r in rest):g} | "
                         f"({len(rest)} more kernels) |")
        lines.append("")
    return lines


def _mode_lines(result: dict) -> list[str]:
    """How ModelNew answers each training mode: its own generated forward (verified, timed), or
    the original forward (and why)."""
    modes, sensitive = result.get("modes") or {}, result.get("mode_modules") or []
    if not sensitive:
        return []
    lines = [f"- mode-dependent submodules: {', '.join(n or '(the model)' for n in sensitive)}"]
    for mode, r in modes.items():
        v, t = r.get("verify") or {}, r.get("timing") or {}
        kw, eager = (t.get("kernelwright") or {}).get("median_ms"), (t.get("eager") or {}).get("median_ms")
        kept = r.get("verify_fallback") or r.get("whole_model_fallback") or r.get("capture") != "ok"
        what = "the original forward" if kept else "its generated forward"
        timing = f", {kw:.3f} ms (eager {eager:.3f} ms)" if kw and eager else ""
        lines.append(f"- {'train and eval' if mode == 'any' else mode} mode: {what}, verification "
                     f"{'PASS' if v.get('passed') else 'FAIL'}{timing}")
    for mode in result.get("untuned_modes") or []:
        lines.append(f"- {mode} mode: the original forward (not generated; `--mode both` generates it)")
    return lines


# ops that make a unit a tensor-core one (GEMM / convolution rates apply) whatever its kind
MATMUL_OPS = {"convolution", "mm", "addmm", "bmm", "baddbmm", "matmul", "linear"}


def unit_flops(group: dict) -> float | None:
    """A unit's FLOPs per call: its "flops" field, else the rate in its note ("61.2 TFLOP/s", which
    GEMM and convolution pairs record) times its time; None when result.json gives neither."""
    if isinstance(group.get("flops"), (int, float)):
        return float(group["flops"])
    m = re.search(r"([\d.]+) TFLOP/s", group.get("note") or "")
    if m and group.get("time_ms"):
        return float(m.group(1)) * 1e12 * group["time_ms"] * 1e-3
    return None


def tensor_core_unit(group: dict) -> bool:
    """Whether a unit's peak is the tensor-core one: a GEMM or convolution kind, or such an op in it."""
    kind = group.get("kind") or ""
    return "gemm" in kind or "conv" in kind or bool(MATMUL_OPS & set(group.get("ops") or ()))


def unit_tflops(g: dict, ms) -> float | None:
    """Achieved TFLOP/s of unit `g` in `ms` (None without a FLOP count or a time)."""
    flops = unit_flops(g)
    return flops / (ms * 1e-3) / 1e12 if flops and isinstance(ms, (int, float)) and ms > 0 else None


def _choice(c: dict, g: dict | None = None) -> str:
    """One implementation of a unit and what it measured: "triton.row 0.012 ms (6 trials, 1 failed)",
    with the achieved TFLOP/s of a compute-anchored unit `g` (or "cuda.row refused: why" for a choice
    whose template could not take the unit)."""
    if c.get("refused"):
        return f"{c['choice']} refused: {c['refused']}"
    t = f"{c['time_ms']:.3f} ms" if c.get("time_ms") is not None else (
        "untimed" if c["choice"] == "library" or not c.get("failed") else "no candidate passed")
    tf = unit_tflops(g or {}, c.get("time_ms")) if g is not None and tensor_core_unit(g) else None
    if tf is not None:
        t += f", {tf:.1f} TFLOP/s"
    tried = f" ({c['trials']} trial{'s' * (c['trials'] != 1)}, {c['failed']} failed)" if c.get("trials") else ""
    return f"{c['choice']} {t}{tried}"


def library_units(groups: list[dict]) -> str:
    """The line naming the searched units (result.json's "groups") whose chosen implementation is the
    library call, each with its ops: "Library units: conv_3 (aten.convolution), ..." or "... none"."""
    names = [f"{g['id']} ({'+'.join(g['ops'])})" for g in groups if g.get("strategy") == "library"]
    return "Library units: " + (", ".join(names) or "none")


def _count(v) -> str:
    """A FLOP or byte count in a short form: 204.3 G, 76.6 M, 740."""
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:g}"


def rewrite_lines(result: dict) -> list[str]:
    """The rewrites section: FLOPs and minimum bytes as captured and after the rewrites, the exact
    algebra rewrites (plan/algebra.py) with the FLOPs each removed, then every other rewrite."""
    from kernelwright.plan.algebra import parse_note

    notes = result.get("rewrites") or []
    a = result.get("analysis") or {}
    lines = []
    if a.get("flops") is not None and a.get("flops_after_rewrites") is not None:
        lines.append(f"- FLOPs {_count(a['flops'])} as captured, {_count(a['flops_after_rewrites'])} after the rewrites; "
                     f"minimum bytes {_count(a['bytes'])} as captured, {_count(a['bytes_after_rewrites'])} after")
    rules = [(line, parse_note(line)) for line in notes]
    exact = [p for _, p in rules if p is not None]
    if exact:
        lines += ["", "Exact algebra (plan/algebra.py; `--no-rewrites` leaves it out):", "",
                  "| node | rewrite | rule | FLOPs removed |", "|---|---|---|---:|"]
        lines += [f"| {p['node']} | {p['what'].replace('|', '/')} | {p['rule']} | {p['flops_removed']:,} |" for p in exact]
        lines.append("")
    lines += [f"- {line}" for line, p in rules if p is None]
    if not lines:
        return []
    return ["", "## Rewrites (exact, then the precision policy's)", ""] + lines


def _num(v, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) else "-"


def ncu_lines(result: dict) -> list[str]:
    """The Nsight Compute section (`--ncu`): per profiled unit its kernels' duration, achieved
    occupancy, DRAM throughput and shared-memory bank conflicts per call, or the line saying why
    there are none; nothing when --ncu was not asked for."""
    from kernelwright.measure.ncu import summary_line

    line = summary_line(result)
    if line is None:
        return []
    lines = ["", "## Nsight Compute counters", "", line]
    rows = [g for g in result.get("groups", []) if g.get("ncu")]
    if rows:
        lines += ["", "| unit | kernels | us per call | achieved occupancy | DRAM throughput | bank conflicts ld | "
                  "bank conflicts st |", "|---|---|---:|---:|---:|---:|---:|"]
        for g in rows:
            n = g["ncu"]
            lines.append(f"| {g['id']} | {', '.join(f'`{k}`' for k in n.get('kernels') or {})} | "
                         f"{_num(n.get('duration_us'), '{:.2f}')} | {_num(n.get('occupancy_pct'), '{:.0f}%')} | "
                         f"{_num(n.get('dram_pct'), '{:.0f}%')} | {_num(n.get('bank_conflicts_ld'), '{:.0f}')} | "
                         f"{_num(n.get('bank_conflicts_st'), '{:.0f}')} |")
        lines += ["", "(occupancy: active warps as % of the peak sustained while the SMs are active; DRAM: % of "
                  "the peak sustained over the kernel's time; bank conflicts summed per call.)"]
    return lines


def render_report(result: dict) -> str:
    from kernelwright.analyze import device_spec

    spec = device_spec()
    lines = [f"# kernelwright report: {result['problem']}", ""]
    lines.append(f"- precision policy: **{result['precision']}** (baselines timed under the same policy"
                 + ("; eager and torch.compile in bf16 autocast, this module with explicit bf16 GEMM/conv operands"
                    " and the output dtypes eager returns)"
                    if result["precision"] == "bf16" else ")"))
    lines.append(f"- device: {result['device']}" + (" (shrunk SMALL shapes)" if result.get("small") else ""))
    if result.get("capture") != "ok":
        where = f" ({result['mode']} mode)" if len(result.get("modes") or {}) > 1 else ""
        lines.append(f"- capture failed{where}: {result['capture']} — ModelNew runs the original forward there")
    v = result.get("verify") or {}
    if v.get("skipped"):
        lines.append(f"- verification: not needed ({v['skipped']})")
    elif v:
        lines.append(f"- verification: **{'PASS' if v.get('passed') else 'FAIL'}**, excess over allclose "
                     f"{v.get('excess')} (eager fp32: {v.get('eager_excess')}, threshold {v.get('threshold')})"
                     + (f": {v.get('reason')}" if v.get("reason") else ""))
    vf = result.get("verify_fallback")
    if vf:
        lines.append(f"- the generated program FAILED verification (excess {vf.get('excess')}, threshold "
                     f"{vf.get('threshold')}: {vf.get('reason')}), so ModelNew keeps the original forward "
                     "(the groups below are what was generated)")
    fb = result.get("whole_model_fallback")
    if fb:
        lines.append(f"- the generated program took {fb['generated_ms']:.3f} ms against eager's {fb['eager_ms']:.3f} ms, "
                     "so ModelNew keeps the original forward (the groups below are what was tried)")
    lines += _mode_lines(result)
    t = result.get("timing")
    lines.append("")
    lines.append(f"## Whole model ({result.get('mode', 'any')} mode)" if len(result.get("modes") or {}) > 1
                 else "## Whole model")
    if t:
        lines += ["", "| implementation | median ms | mean ms | runs | host issue ms |", "|---|---:|---:|---:|---:|"]
        for k, row in t.items():
            if isinstance(row, dict) and "median_ms" in row:
                lines.append(f"| {k} | {_ms(row['median_ms'])} | {_ms(row.get('mean_ms'))} | {row.get('runs', '-')} "
                             f"| {_ms(row.get('issue_ms'))} |")
        lines.append("\n(host issue: CPU time to issue one call, no synchronisation; close to the median, the "
                     "implementation is CPU-bound.)")
        if "cuda_graphs" in t:
            why = t.get("cuda_graphs_why", "faster" if t["cuda_graphs"] else "not faster")
            if why == "host-bound":
                plain = t.get("kernelwright:plain") or {}
                lines.append("\nModelNew replays its forward as CUDA graphs (kernelwright:graphs was not slower than "
                             f"kernelwright:plain, whose host issue time, {plain.get('issue_ms', 0):.3f} ms a call, "
                             f"is {plain.get('issue_ms', 0) / plain.get('median_ms', 1):.0%} of its time: on a slower "
                             "host the plain forward would be host-bound)")
            else:
                lines.append("\nModelNew replays its forward as CUDA graphs (kernelwright:graphs measured faster than "
                             "kernelwright:plain)" if t["cuda_graphs"] else
                             "\nModelNew runs its forward as it is (replaying it as CUDA graphs was not clearly faster)")
            for r in t.get("replay_paths") or []:
                lines.append("- timed replay: " + ("not capturable" if not r["captured"] else
                             f"inputs {'copied in' if r['copies_in'] else 'read in place'}, "
                             f"outputs {'copied out' if r['copies_out'] else 'lent'}"))
        for k, where in (t.get("syncs") or {}).items():
            lines.append(f"\n{k} makes the host wait for the GPU within a call, at {where}")
        if t.get("reused"):
            lines.append(f"\nThese times were measured on {t['reused']['measured']} for the same files on this GPU "
                         "(same versions); this run verified the module and reused them (`--retune` measures again).")
        mode = t.get("compile_mode") or "default"
        for base in ("eager", "compile"):
            if f"speedup_vs_{base}" in t:
                name = base if base == "eager" or mode == "default" else f"compile (mode {mode})"
                lines.append(f"\nspeedup over {name}: **{t[f'speedup_vs_{base}']:.2f}x**")
    elif v.get("skipped"):
        lines.append("\nNot timed: the module keeps its own forward.")
    else:
        lines.append("\nNot timed (no CUDA GPU): timing needs a GPU.")
    if t and t.get("kernels_per_call"):
        lines += _kernel_lines(t["kernels_per_call"])
    precision = result.get("precision") or "fp32"
    lines += ["", "## Groups", "",
              f"Bandwidth is against {spec.name}'s {spec.mem_bw_gbs:.0f} GB/s; TFLOP/s against its "
              f"{spec.peak_tflops(precision):.0f} TFLOP/s under {precision} for units with a convolution or GEMM, "
              f"{spec.fp32_tflops:.0f} for the others.", "",
              "| group | kind | ops | chosen | config | ms | library ms | GB/s | % bw | TFLOP/s | % peak | regs | spills | smem "
              "| excess | eager excess |",
              "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in result.get("groups", []):
        r = g.get("resources") or {}
        cfg = ",".join(f"{k}={v}" for k, v in (g.get("config") or {}).items()) or "-"
        bw = f"{g['gbps']:.0f} | {_pct_bw(g['gbps'], spec.mem_bw_gbs)}" if g.get("gbps") else "- | -"
        tf, peak = unit_tflops(g, g.get("time_ms")), spec.peak_tflops(precision, tensor_core_unit(g))
        flops = f"{tf:.1f} | {100 * tf / peak:.0f}%" if tf is not None and peak else "- | -"
        lines.append(f"| {g['id']} | {g['kind']} | {' '.join(g['ops'])} | {g['strategy']} | {cfg} | {_ms(g.get('time_ms'))} | "
                     f"{_ms(g.get('library_ms'))} | {bw} | {flops} | {r.get('registers', '-')} | {r.get('spills', '-')} | "
                     f"{r.get('shared_bytes', '-')} | {g.get('excess')} | {g.get('eager_excess')} |")
        if g.get("note"):
            lines.append(f"|  | | {g['note']} | | | | | | | | | | | | | |")
    if result.get("groups"):
        lines += ["", library_units(result["groups"])]
    lines += ncu_lines(result)
    choices = [g for g in result.get("groups", []) if g.get("choices")]
    if choices:
        lines += ["", "## Choices per unit (every implementation, timed alike)", ""]
        lines += [f"- {g['id']}: " + "; ".join(_choice(c, g) for c in g["choices"]) for g in choices]
    lines += rewrite_lines(result)
    cov = (result.get("analysis") or {}).get("coverage")
    if cov:
        lines += ["", "## Coverage", "",
                  f"- generated kernels: {100 * cov['generated_bytes']:.0f}% of bytes, {100 * cov['generated_flops']:.0f}% of FLOPs",
                  f"- library calls (cuBLAS/cuDNN/ATen): {100 * cov['library_bytes']:.0f}% of bytes, {100 * cov['library_flops']:.0f}% of FLOPs"]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, result: dict) -> Path:
    path = Path(out_dir) / "report.md"
    path.write_text(render_report(result))
    return path
