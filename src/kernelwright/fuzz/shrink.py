"""Shrinking a wrong fuzz program: render its recorded chain again with one step left out (or
its first input made contiguous float32), keep the smaller program while it still fails the same
check, until nothing more can go; the smallest is written beside the program as
`<name>_min.py`, a fixture-ready problem file whose docstring says what it checks."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from kernelwright.fuzz.generate import Spec, render, spec_of, validate
from kernelwright.fuzz.oracle import Outcome, check


def smaller(spec: Spec) -> list[Spec]:
    """The specs one step simpler than `spec`: each step left out, then the plain first input."""
    out = [replace(spec, steps=spec.steps[:i] + spec.steps[i + 1:]) for i in range(len(spec.steps))
           if len(spec.steps) > 1]
    if spec.layout != "contiguous":
        out.append(replace(spec, layout="contiguous"))
    if spec.double:
        out.append(replace(spec, double=False))
    return out


def _failing(outcome: Outcome, name: str):
    return next((c for c in outcome.wrong if c.name == name), None)


def _note(name: str, detail: str) -> str:
    return (f"Checks the emitted module's `{name}` call against eager (kernelwright.fuzz.oracle);\n"
            f"it failed with: {detail}")


def shrink(path: str | Path, device: str = "cpu", precision: str = "fp32", budget: int = 2,
           log=lambda s: None) -> str:
    """The smallest program (as text) that fails the same check as the wrong program at `path`;
    also written beside it as <name>_min.py. ValueError when the program is not wrong."""
    path = Path(path)
    spec = spec_of(path.read_text())
    outcome = check(path, device, precision, budget)
    if not outcome.wrong:
        raise ValueError(f"{path}: not wrong ({outcome.status})")
    target = outcome.wrong[0]
    with tempfile.TemporaryDirectory(prefix="kw_shrink_") as tmp:
        candidate_path = Path(tmp) / path.name
        progress = True
        while progress:
            progress = False
            for candidate in smaller(spec):
                try:
                    text = render(candidate)
                    validate(text)
                except Exception:  # noqa: BLE001 - a step no longer fits: not a candidate
                    continue
                candidate_path.write_text(text)
                failed = _failing(check(candidate_path, device, precision, budget), target.name)
                if failed is not None:
                    spec, target, progress = candidate, failed, True
                    traits = spec.layout + (", float64" if spec.double else "")
                    log(f"shrink: {spec.chain} ({traits}) still fails {target.name}")
                    break
    text = render(spec, _note(target.name, target.detail))
    path.with_name(f"{path.stem}_min.py").write_text(text)
    return text
