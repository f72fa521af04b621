"""KernelBench-format problem files shrunk to CPU sizes, for `kernelwright fuzz` in the Triton
interpreter: each file's module-level integer sizes rewritten where they are assigned (so sizes
derived from them, such as a bias shape, follow), then kept if its model builds and runs a forward
on the CPU.

usage: python3 scripts/shrink_problems.py OUT_DIR FILE_OR_DIR [FILE_OR_DIR ...] [--pixels 8,12,16]

Rules by the name assigned (to an integer, or to a list or tuple of them, each element alike): a
batch size becomes 2; group counts at most 4; spatial and sequence sizes (height, width, depth,
seq, length, image; h / w / d) at most the first of --pixels for which the model runs (a pooling
stack needs more pixels than a pointwise one); channels, features, dims, hidden and other sizes at
most 16; kernel sizes, strides, paddings, dilations, pool sizes and factors stay. An image batch's shape written with literal sizes (`input_shape = (batch_size, 3, 224,
224)`, `torch.rand(batch_size, 3, 224, 224)`) gets its spatial sizes cut to the same --pixels. A
file whose model fails at every size is reported in one line and not written.
Then: TRITON_INTERPRET=1 kernelwright fuzz OUT_DIR --device cpu --precision bf16 [--backend].
"""
import re
import subprocess
import sys
from pathlib import Path

BATCH = ("batch_size", "batch")
SPATIAL = ("height", "width", "depth", "seq", "length", "image")
KEEP = ("kernel", "stride", "padding", "pool", "dilation", "factor", "scale", "dim1")
WIDTHS = ("channels", "features", "dim", "hidden", "size", "classes")
ASSIGN = re.compile(r"^((?:\w+\s*=\s*)+)(\d+)$")  # a = 3, a = b = 3
TUPLE = re.compile(r"^(\w+(?:\s*,\s*\w+)+)\s*=\s*(\d+(?:\s*,\s*\d+)+)$")  # a, b = 3, 4
LIST = re.compile(r"^(\w+)\s*=\s*([\[(])\s*(\d+(?:\s*,\s*\d+)*)\s*,?\s*([\])])$")  # sizes = [400, 800]


def small(name: str, value: int, pixels: int) -> int:
    n = name.lower()
    if n in BATCH:
        return min(value, 2)
    if "groups" in n:
        return min(value, 4)
    if any(k in n for k in KEEP):
        return value
    if n in ("h", "w", "d") or any(k in n for k in SPATIAL):
        return min(value, pixels)
    if any(k in n for k in WIDTHS):
        return min(value, 16)
    return value


def _statement(text: str, pixels: int) -> str:
    """One top-level statement with its integer sizes shrunk (others unchanged)."""
    s = text.strip()
    m = ASSIGN.match(s)
    if m:
        names = [x.strip() for x in m.group(1).split("=") if x.strip()]
        values = {small(n, int(m.group(2)), pixels) for n in names}
        return " = ".join(names) + f" = {values.pop()}" if len(values) == 1 else text
    m = TUPLE.match(s)
    if m:
        names = [x.strip() for x in m.group(1).split(",")]
        values = [int(x) for x in m.group(2).split(",")]
        if len(names) == len(values):
            return ", ".join(names) + " = " + ", ".join(str(small(n, v, pixels)) for n, v in zip(names, values))
    m = LIST.match(s)
    if m and (m.group(2) + m.group(4)) in ("[]", "()"):
        values = [small(m.group(1), int(x), pixels) for x in m.group(3).split(",")]
        one = "," if m.group(2) == "(" and len(values) == 1 else ""
        return f"{m.group(1)} = {m.group(2)}{', '.join(map(str, values))}{one}{m.group(4)}"
    return text


# an image batch's shape written out: (N, C, H, W) or (N, C, D, H, W) with the spatial sizes as literals,
# assigned to a *shape name or passed to a tensor factory (`torch.rand(batch_size, 3, 224, 224)`)
IMAGE = re.compile(r"(\b\w*shape\w*\s*=\s*\(|torch\.(?:rand|randn|ones|zeros|empty)\()([^()]*)\)")


def _image_sizes(line: str, pixels: int) -> str:
    """`line` with the spatial literals of an image batch's shape (IMAGE) at most `pixels`."""
    def sub(m):
        parts = [x.strip() for x in m.group(2).split(",")]
        if len(parts) in (4, 5) and all(x.isdigit() for x in parts[2:]):
            parts[2:] = [str(min(int(x), pixels)) for x in parts[2:]]
            return m.group(1) + ", ".join(parts) + ")"
        return m.group(0)
    return IMAGE.sub(sub, line)


def shrink(source: str, pixels: int) -> str:
    """`source` with the module-level (unindented) integer assignments shrunk, and the spatial
    literals of image shapes written out (IMAGE) anywhere; comments dropped from the assignments'
    lines, statements joined by ';' handled one by one."""
    out = []
    for line in source.splitlines():
        if line[:1].isalpha() and "=" in line and not line.startswith(("def ", "class ", "import ", "from ")):
            code = line.split("#", 1)[0]
            line = "; ".join(_statement(part, pixels) for part in code.split(";")).rstrip()
        out.append(_image_sizes(line, pixels))
    return "\n".join(out) + "\n"


RUNS = ("import runpy, torch; g = runpy.run_path({path!r}); torch.manual_seed(0); "
        "m = g['Model'](*g['get_init_inputs']()); m(*g['get_inputs']())")


def runs(path: Path) -> str | None:
    """None when the file's model builds and runs a forward on the CPU, else the error's last line."""
    try:
        r = subprocess.run([sys.executable, "-c", RUNS.format(path=str(path))], capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        return "the forward took over 120 s"
    return None if r.returncode == 0 else ((r.stderr.strip().splitlines() or ["failed"])[-1])[:200]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="shrink_problems.py", usage="shrink_problems.py OUT_DIR FILE_OR_DIR "
                                     "[FILE_OR_DIR ...] [--pixels 8,12,16]\n       (python3 scripts/shrink_problems.py ...)",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT_DIR")
    parser.add_argument("sources", nargs="+", metavar="FILE_OR_DIR")
    parser.add_argument("--pixels", default="8,12,16", help="spatial sizes to try, in order")
    a = parser.parse_args(argv)
    try:
        pixels = [int(x) for x in a.pixels.split(",")]
    except ValueError:
        print(f"shrink_problems.py: --pixels must be integers separated by commas, got {a.pixels!r}", file=sys.stderr)
        return 2
    files = []
    for s in map(Path, a.sources):
        if not s.exists():
            print(f"shrink_problems.py: {s}: no such file or folder", file=sys.stderr)
            return 2
        files += sorted(s.glob("*.py")) if s.is_dir() else [s]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for f in files:
        target, why = out / f.name, None
        for p in pixels:
            target.write_text(shrink(f.read_text(), p))
            why = runs(target)
            if why is None:
                written += 1
                break
        else:
            target.unlink()
            print(f"{f.name}: left out ({why})")
    print(f"wrote {written} of {len(files)} problems to {out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
