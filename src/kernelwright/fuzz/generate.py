"""Random valid KernelBench-format programs, deterministic per seed.

A program is a `Spec` -- its batch size, its first input (shape, layout, dtype) and a chain of
steps from the zoo in `steps` -- rendered as a problem file: `class Model`, a module-level
`batch_size` that get_inputs uses (so a second batch size is drawn by changing it), get_inputs()
and get_init_inputs(), a docstring naming the seed and the chain, and the spec itself as a last
comment line (`# fuzz-spec: {...}`), so a program can be rendered again with fewer steps.

Every drawn program is run in eager on the CPU the ways the oracle calls it (train and eval
mode, a second batch size, gradients, float64) before it is returned; one that raises or gives a
non-finite or constant result is drawn again, a bounded number of times.
"""
from __future__ import annotations

import json
import random
import types
from dataclasses import asdict, dataclass, replace

import torch

from kernelwright.fuzz.steps import CATEGORY_WEIGHTS, OPS, Builder, Invalid, label
from kernelwright.problem.load import running_statistics

TRIES = 40
SPEC_PREFIX = "# fuzz-spec: "
FIRST_CATEGORIES = ("anchor", "norm")

# first input ranks (batch included), how often each is drawn, and the sizes of its dimensions
RANKS = {2: 2, 3: 2.5, 4: 4, 5: 1.5}
DIM_SIZES = {
    2: [[7, 13, 16, 33, 48, 64]],
    3: [[3, 4, 5, 7, 8, 13, 16], [7, 9, 13, 16, 33]],
    4: [[3, 4, 5, 7, 8], [5, 6, 7, 8, 9, 11, 13, 16], [5, 6, 7, 8, 9, 11, 13, 16]],
    5: [[2, 3, 4, 5], [3, 4, 5, 6, 7], [3, 4, 5, 6, 7], [3, 4, 5, 6, 7]],
}


@dataclass(frozen=True)
class Step:
    """One step of a chain: an op of the zoo (steps.OPS) and its drawn arguments."""

    op: str
    args: dict

    @property
    def label(self) -> str:
        return label(self.op, self.args)


@dataclass(frozen=True)
class Spec:
    """Everything a program is rendered from. `dims`: the first input's shape after the batch
    dimension; `layout`: how get_inputs draws it ("contiguous", "transposed": the last two
    dimensions drawn swapped and transposed back, "strided": every other element of a wider
    tensor); `double`: the model (`self.double()`) and its inputs in float64."""

    seed: int
    batch: int
    dims: tuple[int, ...]
    layout: str
    double: bool
    steps: tuple[Step, ...]

    @property
    def chain(self) -> str:
        return "+".join(s.label for s in self.steps)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "Spec":
        d = json.loads(text)
        return Spec(d["seed"], d["batch"], tuple(d["dims"]), d["layout"], d["double"],
                    tuple(Step(s["op"], s["args"]) for s in d["steps"]))


@dataclass(frozen=True)
class Program:
    spec: Spec
    text: str


def second_batch_size(batch: int) -> int:
    """The other batch size a program is called with: one more than its own."""
    return batch + 1


def first_input(spec: Spec) -> str:
    """get_inputs' expression for the first input, in the spec's layout and dtype."""
    dtype = ", dtype=torch.float64" if spec.double else ""
    dims = list(spec.dims)
    if spec.layout == "transposed" and len(dims) == 1:
        return f"torch.randn({dims[0]}, batch_size{dtype}).t()"
    if spec.layout == "transposed":
        swapped = dims[:-2] + [dims[-1], dims[-2]]
        return f"torch.randn(batch_size, {', '.join(map(str, swapped))}{dtype}).transpose(-1, -2)"
    if spec.layout == "strided":
        wide = dims[:-1] + [2 * dims[-1]]
        return f"torch.randn(batch_size, {', '.join(map(str, wide))}{dtype})[..., ::2]"
    return f"torch.randn(batch_size, {', '.join(map(str, dims))}{dtype})"


def build(spec: Spec) -> Builder:
    """The spec's steps written one after another; raises Invalid when one does not fit."""
    b = Builder(first_input(spec), spec.dims, ", dtype=torch.float64" if spec.double else "")
    for i, step in enumerate(spec.steps):
        OPS[step.op].emit(b, i, step.args)
    return b


def render(spec: Spec, note: str = "") -> str:
    """The program text of `spec` (raises Invalid when a step does not fit); `note` is added to
    its docstring (what a shrunk program checks)."""
    b = build(spec)
    shape = ", ".join(["batch_size", *map(str, spec.dims)])
    traits = [f"first input ({shape}), {spec.layout}"] + (["float64"] if spec.double else [])
    doc = [f'"""fuzz seed {spec.seed}: {spec.chain}', "",
           "A program of kernelwright's differential fuzzer: " + "; ".join(traits) + "."]
    if note:
        doc += [""] + note.splitlines()
    init = b.init + (["self.double()"] if spec.double else [])
    args = ", ".join(name for name, _ in b.inputs)
    lines = doc + ['"""', "import torch", "import torch.nn as nn", "import torch.nn.functional as F", "",
                   f"batch_size = {spec.batch}", "", "", "class Model(nn.Module):", "    def __init__(self):",
                   "        super().__init__()"]
    lines += [f"        {line}" for line in init]
    lines += ["", f"    def forward(self, {args}):"] + [f"        {line}" for line in b.body]
    lines += [f"        return {b.cur}", "", "", "def get_inputs():",
              "    return [" + ", ".join(expr for _, expr in b.inputs) + "]", "", "",
              "def get_init_inputs():", "    return []", "", "", SPEC_PREFIX + spec.to_json(), ""]
    return "\n".join(lines)


def spec_of(text: str) -> Spec:
    """The spec a program records in its last comment line (ValueError when it has none)."""
    for line in reversed(text.splitlines()):
        if line.startswith(SPEC_PREFIX):
            return Spec.from_json(line[len(SPEC_PREFIX):])
    raise ValueError("not a fuzz program: no '# fuzz-spec:' line")


def _weighted(rng: random.Random, weights: dict):
    keys = sorted(weights, key=str)
    return rng.choices(keys, [weights[k] for k in keys])[0]


def _draw_step(rng: random.Random, dims: tuple[int, ...], categories) -> Step | None:
    """A step of one of `categories` (drawn by weight), then of that category's ops (drawn by
    weight among those whose arguments fit `dims`); None when none fits."""
    category = _weighted(rng, {c: CATEGORY_WEIGHTS.get(c, 1) for c in categories})
    left = {n: op.weight for n, op in OPS.items() if op.category == category}
    while left:
        name = _weighted(rng, left)
        args = OPS[name].draw(rng, dims)
        if args is not None:
            return Step(name, args)
        del left[name]
    return None


def draw_spec(seed: int, attempt: int) -> Spec:
    """One random spec for (seed, attempt); its steps fit their shapes, and it may still fail in
    eager (validate)."""
    rng = random.Random(seed * 7919 + attempt)
    rank = _weighted(rng, RANKS)
    dims = tuple(rng.choice(sizes) for sizes in DIM_SIZES[rank])
    layout = rng.choices(["contiguous", "transposed", "strided"], [7, 2, 1])[0]
    spec = Spec(seed, rng.randint(2, 4), dims, layout, rng.random() < 0.15, ())
    steps: list[Step] = []
    for i in range(rng.randint(2, 6)):
        b = build(replace(spec, steps=tuple(steps)))
        for _ in range(8):
            step = _draw_step(rng, b.dims, FIRST_CATEGORIES if i == 0 else CATEGORY_WEIGHTS)
            if step is None:
                continue
            try:
                build(replace(spec, steps=tuple(steps + [step])))
            except Invalid:
                continue
            steps.append(step)
            break
        if not steps:
            raise Invalid("no anchor or norm fits the first input")
    return replace(spec, steps=tuple(steps))


def load_text(text: str, name: str = "kernelwright_fuzz_program") -> types.ModuleType:
    """Execute a program's text as a fresh module."""
    module = types.ModuleType(name)
    exec(compile(text, name, "exec"), module.__dict__)
    return module


def _sane(out, what: str) -> torch.Tensor:
    """`out` when it is one finite tensor of moderate values that are not all the same."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{what}: forward returned {type(out).__name__}")
    values = out.detach()
    if not torch.isfinite(values).all():
        raise ValueError(f"{what}: non-finite output")
    if values.abs().max() > 1e4:
        raise ValueError(f"{what}: output larger than 1e4")
    spread = float(values.max() - values.min()) if values.numel() else 0.0
    if values.numel() < 2 or spread <= 1e-4 * (1 + float(values.abs().max())):
        raise ValueError(f"{what}: constant output (up to rounding)")
    return out


def validate(text: str) -> None:
    """Run the program in eager on the CPU as the oracle calls it: train and eval mode (running
    statistics drawn), at its batch size and the second one, with gradients (finite input and
    parameter gradients) and in float64. Raises on an exception or a non-finite, huge or
    constant output (constant up to rounding too: a mean of normalised values, say). The
    caller's torch random state is left as it was."""
    module = load_text(text)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for batch in (module.batch_size, second_batch_size(module.batch_size)):
            module.batch_size = batch
            model = module.Model()
            for training in (True, False):
                if not training:
                    running_statistics(model, 0)
                with torch.no_grad():
                    _sane(model.train(training)(*module.get_inputs()), f"batch {batch} train={training}")
            inputs = [x.requires_grad_() if x.is_floating_point() else x for x in module.get_inputs()]
            out = _sane(model.train()(*inputs), "with gradients")
            (out * torch.randn_like(out)).sum().backward()
            grads = [x.grad for x in inputs] + [p.grad for p in model.parameters()]
            if any(g is not None and not torch.isfinite(g).all() for g in grads):
                raise ValueError("non-finite gradients")
        model.double()
        with torch.no_grad():
            out = _sane(model(*[x.double() for x in module.get_inputs()]), "float64")
        if out.dtype != torch.float64:
            raise ValueError(f"float64 model returned {out.dtype}")


def draw(seed: int) -> Program:
    """The program of `seed`: the first of its attempts that renders and runs in eager."""
    last = ""
    for attempt in range(TRIES):
        try:
            spec = draw_spec(seed, attempt)
            text = render(spec)
            validate(text)
        except Exception as e:  # noqa: BLE001 - any failure of a drawn program: draw again
            last = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            continue
        return Program(spec, text)
    raise RuntimeError(f"seed {seed}: no valid program in {TRIES} attempts (last: {last})")


def generate(seed: int) -> str:
    """The text of seed's program (deterministic per seed)."""
    return draw(seed).text

