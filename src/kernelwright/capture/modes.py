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

__all__ = ["mode_modules", "reads_training"]


def mode_modules(model: torch.nn.Module) -> list[str]:
    """Qualified names ("" for the root) of the submodules whose result depends on their training flag."""
    return [name for name, m in model.named_modules() if reads_training(type(m))]


@functools.lru_cache(maxsize=None)
def reads_training(cls: type) -> bool:
    """Whether `cls` or one of its bases below nn.Module reads `training` (True when unknown)."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            break
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            return True
        if _names_training(source):
            return True
    return False


def _names_training(source: str) -> bool:
    try:
        tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
        return any(t.type == tokenize.NAME and t.string == "training" for t in tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return True
