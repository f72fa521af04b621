"""Which submodules behave differently in `train()` and `eval()`.

A module's result depends on its training flag when its class (or a base class below
`nn.Module`) reads the name `training` in code: BatchNorm, Dropout, InstanceNorm with running
statistics, recurrent layers with dropout, any user module with an `if self.training:` branch.
The check reads the classes' source tokens (names only: a docstring that mentions training does
not count); a class whose source cannot be read counts as reading it, so the answer errs towards
"depends on the mode" — the safe side, since a mode-dependent module gets one forward per mode.
"""
from __future__ import annotations

import functools
import inspect
import io
import textwrap
import tokenize

import torch

from kernelwright.errors import UserError

__all__ = ["mode_modules", "reads_training", "training_modes"]


def mode_modules(model: torch.nn.Module) -> list[str]:
    """Qualified names ("" for the root) of the submodules whose result depends on their training
    flag: their class reads it, or a forward hook on them does (the old-style spectral norm's
    power iteration runs in training mode only)."""
    return [name for name, m in model.named_modules() if reads_training(type(m)) or _hooks_read_training(m)]


def _hooks_read_training(m: torch.nn.Module) -> bool:
    """Whether a forward (pre-)hook of `m` reads `training`: a function's source, or a callable
    object's class (True when unknown, as for classes)."""
    hooks = [*m._forward_pre_hooks.values(), *m._forward_hooks.values()]
    return any(_code_reads_training(hook) if inspect.isfunction(hook) or inspect.ismethod(hook)
               else reads_training(type(hook)) for hook in hooks)


@functools.lru_cache(maxsize=None)
def reads_training(cls: type) -> bool:
    """Whether `cls` or one of its bases below nn.Module reads `training` (True when unknown)."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            break
        if _code_reads_training(klass):
            return True
    return False


def _code_reads_training(obj) -> bool:
    """Whether the source of a class or function names `training` (True when it cannot be read)."""
    try:
        return _names_training(inspect.getsource(obj))
    except (OSError, TypeError):
        return True


def _names_training(source: str) -> bool:
    try:
        tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
        return any(t.type == tokenize.NAME and t.string == "training" for t in tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return True


def training_modes(problem, wanted: str) -> tuple[list[str], list[str], dict[str, list[tuple]], dict]:
    """(mode-dependent submodules, the modes to generate a forward for, each mode's keys: the
    training flags of those submodules it answers for, the captures made to compare the modes,
    by mode). A model built with some submodules in eval mode (a frozen BatchNorm) keeps them so
    in its "train" mode. Without mode-dependent submodules, or when both modes capture the same
    graph, one forward serves both: ["any"]."""
    if wanted not in ("train", "eval", "both"):
        raise UserError(f"mode {wanted!r}: choose train, eval or both")
    from kernelwright.capture.export import CaptureError, capture

    sensitive = mode_modules(problem.make_model("meta"))
    if not sensitive:
        return [], ["any"], {"any": [()]}, {}
    train, evals = problem.in_mode(True), problem.in_mode(False)
    keys = {"train": [_flags(train, sensitive)], "eval": [_flags(evals, sensitive)]}
    graphs = {}
    for mode, p in (("train", train), ("eval", evals)):
        try:
            graphs[mode] = capture(p)
        except CaptureError:
            pass  # reported when that mode is captured again on its own
    if len(graphs) == 2 and _same_graph(graphs["train"], graphs["eval"]):
        return sensitive, ["any"], {"any": list(dict.fromkeys(keys["train"] + keys["eval"]))}, \
            {"any": graphs["train"]}
    return sensitive, ["train", "eval"] if wanted == "both" else [wanted], keys, graphs


def _flags(problem, names: list[str]) -> tuple[bool, ...]:
    """The training flags of submodules `names` of `problem`'s model."""
    model = problem.make_model("meta")
    return tuple(model.get_submodule(n).training for n in names)


def _same_graph(a, b) -> bool:
    """Whether two captures compute the same ops on the same values."""
    ops = lambda g: [(n.target, repr(n.args), repr(n.kwargs)) for n in g.nodes]  # noqa: E731
    return ops(a) == ops(b) and a.outputs == b.outputs and a.mutations == b.mutations
