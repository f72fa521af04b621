#!/usr/bin/env python3
"""How much of each problem's device time is its GEMM, from the optimize runs' report.md kernel
tables (torch.profiler, per call), and the most kernelwright could gain over torch.compile
without a faster GEMM: compile's total / compile's GEMM time (everything else free).

usage: python3 scripts/gemm_share.py RUNS_DIR [RUNS_DIR ...]   (bench --out folders, e.g. /tmp/kw_bf16)
"""
import re
import sys
from pathlib import Path

TABLE = re.compile(r"\*\*(\S+)\*\*: ([\d.]+) us in (\d+) launches\n\n\| us \| launches \| kernel \|\n"
                   r"\|---:\|---:\|---\|\n((?:\|.*\n)+)")
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "gemv")  # library and generated GEMM kernels


def kernel_tables(report: str) -> dict[str, tuple[float, list[tuple[float, str]]]]:
    """implementation -> (device us per call, [(us, kernel name)]) from a report.md's kernel tables."""
    out = {}
    for m in TABLE.finditer(report):
        rows = []
        for line in m.group(4).splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.append((float(cells[0]), cells[2].strip("`")))
        out[m.group(1)] = (float(m.group(2)), rows)
    return out


def is_gemm(kernel: str) -> bool:
    k = kernel.lower()
    return any(t in k for t in GEMM_NAMES) and "layout" not in k


def main(dirs: list[str]) -> None:
    print("| run | problem | compile us | its GEMM us (share) | kernelwright us | its GEMM us | compile / GEMM (bound) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for d in dirs:
        for report in sorted(Path(d).glob("level*/*/report.md")):
            tables = kernel_tables(report.read_text())
            comp, kw = tables.get("compile"), tables.get("kernelwright") or tables.get("kernelwright:plain")
            if not comp or not kw:
                continue
            cg, kg = (sum(us for us, name in t[1] if is_gemm(name)) for t in (comp, kw))
            if not cg:
                continue
            print(f"| {Path(d).name} | {report.parent.name} | {comp[0]:.1f} | {cg:.1f} ({100 * cg / comp[0]:.0f}%) | "
                  f"{kw[0]:.1f} | {kg:.1f} | {comp[0] / cg:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(sys.argv[1:])
