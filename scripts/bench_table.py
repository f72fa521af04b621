#!/usr/bin/env python3
"""Turn `kernelwright bench --json` output into the markdown tables of docs/benchmarks.md.

One section per file: the per-level summary (geometric means against eager and torch.compile,
fast_p), the per-anchor means, and one row per problem. A `bench --baseline-only` file gives the
eager and torch.compile columns only. Needs no GPU and no torch.

usage: python3 scripts/bench_table.py BENCH.json [BENCH.json ...]
"""
import argparse
import json


def fmt(v, nd=3):
    return f"{v:.{nd}f}" if isinstance(v, (int, float)) else "-"


def baseline_table(data: dict) -> str:
    """`bench --baseline-only`: eager and torch.compile times, no kernelwright column."""
    opts = data["options"]
    mode = opts.get("compile_mode") or "default"
    out = [f"### baselines only, {opts['precision']} — {data['gpu']}, torch {data['torch']}"
           + ("" if mode == "default" else f", torch.compile mode {mode}"), "",
           "| level | n | compile / eager (geomean) |", "|---|---:|---:|"]
    out += [f"| {lvl} | {s['n']} | {fmt(s.get('compile_over_eager'))} |" for lvl, s in data["summary"].items()]
    out += ["", "| problem | eager ms | compile ms | compile / eager |", "|---|---:|---:|---:|"]
    for r in sorted(data["rows"], key=lambda r: (r.get("level") or 0, r["problem"])):
        t = r.get("times", {})
        e, c = t.get("eager"), t.get("compile")
        out.append(f"| L{r.get('level')} {r['problem']} | {fmt(e)} | {fmt(c)} | {fmt(e / c if e and c else None, 2)} |")
    return "\n".join(out)


def table(path: str) -> str:
    data = json.load(open(path))
    opts = data["options"]
    if opts.get("baseline_only"):
        return baseline_table(data)
    mode = opts.get("compile_mode") or "default"
    out = [f"### {opts['precision']} — {data['gpu']}, torch {data['torch']}, budget {opts['trials']} trials/problem"
           + ("" if mode == "default" else f", torch.compile mode {mode}"), ""]
    out += ["| level | n | correct | kw / compile (geomean) | kw / eager | compile / eager | fast_1 vs compile | fast_2 vs compile |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for lvl, s in data["summary"].items():
        out.append(f"| {lvl} | {s['n']} | {fmt(s.get('correct'), 2)} | {fmt(s.get('kw_over_compile'))} | {fmt(s.get('kw_over_eager'))} | "
                   f"{fmt(s.get('compile_over_eager'))} | {fmt(s.get('fast_1_compile'), 2)} | {fmt(s.get('fast_2_compile'), 2)} |")
    anchors = [f"{lvl} {a} ({n}): {fmt(x)}" for lvl, s in data["summary"].items()
               for a, (n, x) in (s.get("kw_over_compile_by_anchor") or {}).items()]
    if anchors:
        out += ["", "kw / compile by anchor (geomean): " + "; ".join(anchors)]
    graphs = any("kernelwright:graphs" in r.get("times", {}) for r in data["rows"])
    out += ["", "| problem | eager ms | compile ms | kernelwright ms | correct | vs compile | units with generated kernels |"
            + (" plain / CUDA-graph forward ms |" if graphs else ""),
            "|---|---:|---:|---:|---|---:|---|" + ("---|" if graphs else "")]
    for r in sorted(data["rows"], key=lambda r: (r.get("level") or 0, r["problem"])):
        t = r.get("times", {})
        kw, comp = t.get("kernelwright"), t.get("compile")
        gen = [g[0] for g in r.get("groups", []) if g[2] == "triton"]
        line = (f"| L{r.get('level')} {r['problem']} | {fmt(t.get('eager'))} | {fmt(comp)} | {fmt(kw)} | "
                f"{('yes (original forward: the generated one failed verification)' if r.get('fallback') else 'yes') if r.get('correct') else 'NO'} | {fmt(comp / kw if kw and comp else None, 2)} | {', '.join(gen) or '-'} |")
        if graphs:  # both forwards timed; the shipped one (kernelwright ms) in bold
            plain, replay = t.get("kernelwright:plain"), t.get("kernelwright:graphs")
            cells = [fmt(plain), fmt(replay)]
            if plain is not None and replay is not None:
                cells[1 if r.get("cuda_graphs") else 0] = f"**{cells[1 if r.get('cuda_graphs') else 0]}**"
            line += f" {' / '.join(cells)} |"
        out.append(line)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", nargs="+", help="JSON files written by `kernelwright bench --json`")
    args = ap.parse_args()
    print("\n\n".join(table(p) for p in args.bench))


if __name__ == "__main__":
    main()
