"""A fuzz run: programs of seeds seed, seed + 1, ... generated, written under out/programs/,
checked by the oracle (emitted modules under out/emitted/), one line each, then the summary line
`fuzz: N programs, W wrong, F failed to optimize, K kept original`.

A program the oracle cannot finish (an exception of its own) is that program's `failed`, never
the end of the run; Ctrl-C ends the run with the summary of the programs so far. Wrong programs
are copied to out/wrong/ (with their outcome as JSON) for shrinking; out/results.jsonl holds
every outcome.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from kernelwright.fuzz.generate import draw
from kernelwright.fuzz.oracle import Outcome, check, first_line

DETAIL_CHARS = 160


@dataclass
class Result:
    """One program of a run: its seed, chain and outcome, and the seconds it took in all."""

    seed: int
    chain: str
    outcome: Outcome
    seconds: float


@dataclass
class Summary:
    results: list[Result] = field(default_factory=list)
    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.outcome.status == status)

    @property
    def line(self) -> str:
        return (f"fuzz: {len(self.results)} programs, {self.count('wrong')} wrong, "
                f"{self.count('failed')} failed to optimize, {self.count('kept')} kept original")

    @property
    def mean_seconds(self) -> float:
        return sum(r.seconds for r in self.results) / len(self.results) if self.results else 0.0


def program_line(r: Result) -> str:
    """`fuzz  17 wrong   conv2d+bn+relu  eval: max error 0.31 ...  (4.2 s)`."""
    o = r.outcome
    tail = o.reason if o.status in ("wrong", "failed", "kept") else ""
    if len(tail) > DETAIL_CHARS:
        tail = tail[:DETAIL_CHARS - 3] + "..."
    return f"fuzz {r.seed:3d} {o.status:<7} {r.chain}" + (f"  {tail}" if tail else "") + f"  ({r.seconds:.1f} s)"


def _one(seed: int, device: str, precision: str, out: Path, budget: int, no_library: bool = False,
         backend: bool = False) -> Result:
    """Generate, write and check the program of `seed`; a failure of the generator or of the
    oracle itself is the program's `failed`."""
    started = time.time()
    path = out / "programs" / f"fuzz_{seed:05d}.py"
    try:
        program = draw(seed)
    except Exception as e:  # noqa: BLE001
        return Result(seed, "?", Outcome(str(path), "failed", reason=f"generate raised {first_line(e)}"),
                      time.time() - started)
    path.write_text(program.text)
    try:
        outcome = check(path, device, precision, budget, work=out / "emitted" / path.stem, no_library=no_library,
                        backend=backend)
    except Exception as e:  # noqa: BLE001 - the oracle's own failure ends this program only
        outcome = Outcome(str(path), "failed", reason=f"oracle raised {first_line(e)}")
    return Result(seed, program.spec.chain, outcome, time.time() - started)


def _record(r: Result, out: Path) -> None:
    """Append the outcome to results.jsonl; copy a wrong program and its outcome to wrong/."""
    row = json.dumps({"seed": r.seed, "chain": r.chain, "seconds": round(r.seconds, 2), **asdict(r.outcome)})
    with open(out / "results.jsonl", "a") as f:
        f.write(row + "\n")
    if r.outcome.status == "wrong":
        wrong = out / "wrong"
        wrong.mkdir(exist_ok=True)
        program = Path(r.outcome.path)
        shutil.copy(program, wrong / program.name)
        (wrong / f"{program.stem}.json").write_text(json.dumps(json.loads(row), indent=2))


def _one_file(i: int, path: Path, device: str, precision: str, out: Path, budget: int, small: bool,
              no_library: bool = False, backend: bool = False) -> Result:
    """Check the existing program at `path` (the i-th of a run over files)."""
    started = time.time()
    small = small and re.search(r"^SMALL\s*=", Path(path).read_text(), re.M) is not None  # (fixtures are small)
    try:
        outcome = check(path, device, precision, budget, work=out / "emitted" / f"{i:03d}_{Path(path).stem}",
                        small=small, no_library=no_library, backend=backend)
    except Exception as e:  # noqa: BLE001 - the oracle's own failure ends this program only
        outcome = Outcome(str(path), "failed", reason=f"oracle raised {first_line(e)}")
    return Result(i, Path(path).stem, outcome, time.time() - started)


def _drive(jobs: Iterable[Callable[[], Result]], out: Path, log: Callable[[str], None]) -> Summary:
    """Run the jobs in order, one line each, then the summary line (Ctrl-C: the summary so far)."""
    summary = Summary()
    try:
        for job in jobs:
            r = job()
            summary.results.append(r)
            _record(r, out)
            log(program_line(r))
    except KeyboardInterrupt:
        summary.interrupted = True
        log("fuzz: interrupted")
    if summary.results:
        log(f"fuzz: {summary.mean_seconds:.1f} s per program on average")
    log(summary.line)
    return summary


def run_files(paths: list[Path], device: str = "cpu", precision: str = "fp32", out_dir: Path = Path("kw_fuzz"),
              budget: int = 2, small: bool = False, log: Callable[[str], None] = print,
              no_library: bool = False, backend: bool = False) -> Summary:
    """The oracle over existing programs (shipped problems, fixtures; `small`: their SMALL size
    overrides) instead of generated ones: one line each, numbered in order and named by file.
    `no_library`, `backend`: as check's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _drive((functools.partial(_one_file, i, p, device, precision, out, budget, small, no_library, backend)
                   for i, p in enumerate(paths)), out, log)


def run(count: int, seed: int = 0, device: str = "cpu", precision: str = "fp32", out_dir: Path = Path("kw_fuzz"),
        budget: int = 2, log: Callable[[str], None] = print, no_library: bool = False,
        backend: bool = False) -> Summary:
    """Generate and check `count` programs (seeds seed .. seed + count - 1); see the module docstring.
    `no_library`, `backend`: as check's."""
    out = Path(out_dir)
    (out / "programs").mkdir(parents=True, exist_ok=True)
    return _drive((functools.partial(_one, seed + i, device, precision, out, budget, no_library, backend)
                   for i in range(count)), out, log)
