"""Loss curves of training-step bench JSONs (bench --train, scripts/train_bench.py): one panel per
problem and precision, each implementation's loss per step, and below it the relative difference
from eager's curve (what ``loss_drift`` reports as its largest value).

usage: python3 scripts/loss_curves.py OUT.png BENCH.json [BENCH.json ...]
"""
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="loss_curves.py", usage="loss_curves.py OUT.png BENCH.json [BENCH.json ...]\n"
                                     "       (python3 scripts/loss_curves.py ...)", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT.png")
    parser.add_argument("files", nargs="+", metavar="BENCH.json")
    a = parser.parse_args(argv)
    out, files = Path(a.out), [Path(f) for f in a.files]
    panels = []
    for f in files:
        try:
            bench = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            print(f"loss_curves.py: cannot read {f}: {e}", file=sys.stderr)
            return 1
        precision = (bench.get("options") or {}).get("precision", f.stem)
        for row in bench.get("rows", []):
            curves = {name: r["losses"] for name, r in (row.get("train") or {}).items() if r.get("losses")}
            if curves:
                panels.append((f"{row['problem']} ({precision})", curves))
    if not panels:
        print("loss_curves.py: no loss curves in the files named (bench rows without 'losses')", file=sys.stderr)
        return 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 6), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [3, 1]})
    for (title, curves), top, bottom in zip(panels, axes[0], axes[1]):
        eager = curves.get("eager")
        for name, losses in curves.items():
            (line,) = top.plot(range(1, len(losses) + 1), losses, label=name, lw=1.2)
            if eager and name != "eager":  # (in the same colour as its curve above)
                bottom.plot(range(1, len(losses) + 1), [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, eager)],
                            label=name, lw=1, color=line.get_color())
        top.set_title(title, fontsize=9)
        top.set_ylabel("loss")
        top.legend(fontsize=7)
        bottom.set_yscale("log")
        bottom.set_xlabel("step")
        bottom.set_ylabel("|loss - eager's| / eager's", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(panels)} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
