"""Rich tables for `kernelwright inspect`."""
from __future__ import annotations

from rich.table import Table

from kernelwright.analyze.roofline import Analysis, NodeRow


def fmt_si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, as in GB/s and TFLOP/s)."""
    if value == 0:
        return f"0 {unit}".rstrip()
    for div, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def fmt_flops(flops: float) -> str:
    return fmt_si(flops, "FLOP")


def fmt_bytes(nbytes: float) -> str:
    return fmt_si(nbytes, "B")


def fmt_us(us: float) -> str:
    if us == 0:
        return "0"
    if us < 1:
        return f"{us * 1e3:.3g} ns"
    if us < 1e3:
        return f"{us:.3g} µs"
    if us < 1e6:
        return f"{us / 1e3:.3g} ms"
    return f"{us / 1e6:.3g} s"


def fmt_shape(shape) -> str:
    if shape is None:
        return "-"
    return "×".join(str(s) for s in shape) if shape else "scalar"


def fmt_intensity(x: float | None) -> str:
    return "∞" if x is None else f"{x:.3g}"


def render_table(analysis: Analysis, group_free: bool = True) -> Table:
    """One row per node (runs of free view nodes collapsed into one dim row when `group_free`),
    then a totals row; the caption names the device, its ceilings and the class mix."""
    spec = analysis.device
    title = f"{analysis.problem} on {spec.name} ({analysis.precision})"
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("node", overflow="fold")
    table.add_column("op")
    table.add_column("class")
    table.add_column("shape")
    table.add_column("FLOPs", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("FLOP/B", justify="right")
    table.add_column("roofline", justify="right")
    table.add_column("bound")

    pending: list[NodeRow] = []

    def flush():
        if not pending:
            return
        if len(pending) == 1:
            _add(table, pending[0])
        else:
            ops = ", ".join(dict.fromkeys(r.op for r in pending))
            table.add_row(f"{pending[0].name} … {pending[-1].name}", ops, "data_movement",
                          f"{len(pending)} views", "0", "0", "", "0", "", style="dim")
        pending.clear()

    for r in analysis.nodes:
        if group_free and r.free:
            pending.append(r)
            continue
        flush()
        _add(table, r)
    flush()

    t = analysis.totals
    table.add_section()
    table.add_row("total", f"{t['nodes']} nodes", "", "", fmt_flops(t["flops"]), fmt_bytes(t["bytes"]),
                  fmt_intensity(t["intensity"]) if t["bytes"] else "", fmt_us(t["roofline_us"]),
                  t["bound"], style="bold")
    table.add_row("fused floor", "inputs + outputs once", "", "", fmt_flops(t["flops"]),
                  fmt_bytes(t["io_bytes"]), "", fmt_us(t["fused_roofline_us"]), t["fused_bound"],
                  style="italic")
    mix = ", ".join(f"{cls} {share:.0%}" for cls, share in sorted(t["time_share"].items(), key=lambda kv: -kv[1])
                    if share >= 0.005)
    caption = (f"{spec.name}: {spec.mem_bw_gbs:g} GB/s, fp32 {spec.fp32_tflops:g} / tf32 {spec.tf32_tflops:g} / "
               f"bf16 {spec.bf16_tflops:g} TFLOP/s ({spec.source})")
    if spec.note:
        caption += f"\n{spec.note}"
    if mix:
        caption += f"\nroofline time by class: {mix}"
    table.caption = caption
    return table


def _add(table: Table, r: NodeRow) -> None:
    table.add_row(
        r.name, r.op, r.cls, fmt_shape(r.shape),
        fmt_flops(r.flops) if r.flops else "0",
        fmt_bytes(r.bytes) if r.bytes else "0",
        "" if r.free else fmt_intensity(r.intensity),
        fmt_us(r.roofline_us),
        "" if r.free else r.bound,
        style="dim" if r.free else None,
    )


def render_class_summary(analysis: Analysis) -> Table:
    """Per class: node count and share of FLOPs, bytes and roofline time."""
    t = analysis.totals
    table = Table(title="by class", header_style="bold")
    for col in ("class", "nodes", "FLOPs", "bytes", "time"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for cls, n in t["count"].items():
        table.add_row(cls, str(n), f"{t['flops_share'].get(cls, 0):.1%}", f"{t['bytes_share'].get(cls, 0):.1%}",
                      f"{t['time_share'].get(cls, 0):.1%}")
    return table
