"""Load a KernelBench-format problem file, or wrap a module and example inputs, as a `Problem`.

Shrinking: a problem file may define a module-level dict `SMALL` mapping its size globals to
smaller values (`SMALL = {"batch_size": 4, "dim": 256}`); `load_problem(path, small=True)`
applies it, so `get_inputs()`/`get_init_inputs()` produce CPU-test-sized shapes.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from kernelwright.errors import ProblemError, UserError

_counter = itertools.count()


@dataclass
class Problem:
    """A problem: how to build the model and draw its inputs.

    `model_factory(device)` returns a fresh model whose weights depend only on `init_seed`;
    `input_factory(seed, device)` returns a fresh list of inputs drawn under `seed`.
    """

    name: str
    path: Path | None
    model_cls: type | None
    get_inputs: Callable[[], list]
    get_init_inputs: Callable[[], list]
    level: int | None = None
    source: str | None = None  # the problem file's text (copied into emitted modules)
    init_seed: int = 0
    training: bool = True  # the mode make_model's models are in (train(), or eval())
    _module: Any = field(default=None, repr=False)
    _instance: torch.nn.Module | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else self.name

    def make_model(self, device: str | torch.device = "cpu") -> torch.nn.Module:
        """A fresh model on `device`, weights drawn under `init_seed` (or a copy of the given module)."""
        if self._instance is not None:
            import copy

            model = copy.deepcopy(self._instance).to(device)
            # (the live module's own flags in its own mode: a frozen BatchNorm stays frozen)
            return model if model.training == self.training else model.train(self.training)
        torch.manual_seed(self.init_seed)
        try:
            with torch.device(device):
                init = list(self.get_init_inputs())
                model = self.model_cls(*init)
        except Exception as e:  # noqa: BLE001 - user code
            if str(device) == "meta" and "meta tensor" in str(e).lower():
                # a constructor that reads a value (Swin's drop-path rates: linspace(...)[i].item())
                # cannot run on the meta device: built on the CPU, then moved (shapes are all the
                # meta device is for)
                return self.make_model("cpu").to("meta")
            raise ProblemError(self.where, f"Model(*get_init_inputs()) raised {type(e).__name__}: {_first_line(e)}") from e
        if not isinstance(model, torch.nn.Module):
            raise ProblemError(self.where, "Model(...) did not return a torch.nn.Module")
        if not self.training:
            model.eval()
            running_statistics(model, self.init_seed)
        return model

    def in_mode(self, training: bool) -> "Problem":
        """This problem with its models in train() (True) or eval() (False) mode."""
        import dataclasses

        return dataclasses.replace(self, training=training)

    def make_inputs(self, seed: int, device: str | torch.device = "cpu") -> list:
        """Fresh inputs drawn on `device` under `seed` (drawn on the GPU directly: they can be large)."""
        torch.manual_seed(seed)
        try:
            with torch.device(device):
                inputs = self.get_inputs()
        except Exception as e:  # noqa: BLE001 - user code
            raise ProblemError(self.where, f"get_inputs() raised {type(e).__name__}: {_first_line(e)}") from e
        if not isinstance(inputs, (list, tuple)):
            raise ProblemError(self.where, "get_inputs() must return a list")
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def check(self, device: str | torch.device = "meta") -> list[torch.Tensor] | None:
        """Run the model once on `device` (meta by default: shapes only) and check its outputs.

        Returns the outputs as a flat list of tensors; raises ProblemError for bad problems. A
        forward that reads tensor values (.item()) or calls an op without a meta kernel cannot run
        on the meta device: then None, and the first run on real data (optimize runs eager before
        any work) is the check.
        """
        model = self.make_model(device)
        inputs = self.make_inputs(0, device)
        try:
            with torch.no_grad(), quiet_torch_logs():
                out = model(*inputs)
        except Exception as e:  # noqa: BLE001 - user code
            if str(device) == "meta" and ("meta tensor" in str(e).lower() or isinstance(e, NotImplementedError)):
                return None  # (a value read, or an op without a meta kernel such as bincount)
            raise ProblemError(self.where, f"forward raised {type(e).__name__}: {_first_line(e)}") from e
        return flatten_outputs(out, self.where)


def running_statistics(model: torch.nn.Module, seed: int) -> None:
    """Give every running mean / variance buffer of `model` values drawn under `seed` (means from
    N(0, 0.5²), variances from U(0.5, 2)), as a trained model has: a fresh model's zeros and ones
    would let an eval-mode forward that normalises wrongly pass its checks."""
    gen = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if not buf.is_floating_point() or buf.device.type == "meta":
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "running_mean":
                buf.copy_(0.5 * torch.randn(buf.shape, generator=gen, dtype=buf.dtype))
            elif leaf == "running_var":
                buf.copy_(0.5 + 1.5 * torch.rand(buf.shape, generator=gen, dtype=buf.dtype))


@contextlib.contextmanager
def quiet_torch_logs():
    """Silence torch's fake/meta-tensor error logging: failures reach the user as one line."""
    import logging

    names = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch.export", "torch._export")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


OUTPUT_CONTAINERS = (tuple, list, dict)


def output_tree(out: Any, where: str = "model") -> tuple[list[torch.Tensor], str]:
    """The model's output as its tensors in order and its structure (`output_skeleton`): a tensor,
    or tuples, lists and dicts of tensors (and Nones) nested; anything else is a ProblemError."""
    bad = _foreign(out)
    if bad is not None:
        held = f" holding a {bad}" if type(out) in OUTPUT_CONTAINERS else ""
        raise ProblemError(where, "forward must return tensors (alone, or in tuples, lists and dicts), "
                                  f"got {type(out).__name__}{held}")
    from torch.utils import _pytree

    tensors = [x for x in _pytree.tree_leaves(out) if x is not None]
    if not tensors:
        raise ProblemError(where, f"forward returned no tensor (got {type(out).__name__})")
    return tensors, output_skeleton(out)


def output_skeleton(out: Any) -> str:
    """The structure of an output as text, each tensor a T (`{'logits': T, 'aux': (T, None)}`): two
    outputs of one structure (containers, dict keys in order, where the Nones are) have equal texts."""
    if out is None:
        return "None"
    if isinstance(out, torch.Tensor):
        return "T"
    if type(out) is dict:
        return "{" + ", ".join(f"{k!r}: {output_skeleton(v)}" for k, v in out.items()) + "}"
    if not isinstance(out, (tuple, list)):
        return type(out).__name__
    items = [output_skeleton(v) for v in out]
    if type(out) is list:
        return "[" + ", ".join(items) + "]"
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _foreign(x: Any) -> str | None:
    """The type name of the first thing in an output that is not a tensor, None, tuple, list or
    dict (a namedtuple or dataclass is such a thing: it is not rebuilt from the graph's tensors)."""
    if x is None or isinstance(x, torch.Tensor):
        return None
    if type(x) not in OUTPUT_CONTAINERS:
        return type(x).__name__
    if type(x) is dict and not all(type(k) in (str, int) for k in x):
        return "dict with keys other than strings and integers"
    items = x.values() if type(x) is dict else x
    return next((n for n in map(_foreign, items) if n is not None), None)


def flatten_outputs(out: Any, where: str = "model") -> list[torch.Tensor]:
    """The model's output tensors as a flat list (see output_tree); anything else is a ProblemError."""
    return output_tree(out, where)[0]


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


@contextlib.contextmanager
def eager_under(policy, where: str, device):
    """The block eager PyTorch runs the model in under `policy` (no grad, its TF32 switches, its
    autocast). What the model raises there is the model's problem, not ours: a one-line
    ProblemError naming `where` (oneDNN has no bf16 LSTM on the CPU, say)."""
    try:
        with torch.no_grad(), policy.active(), policy.baseline(device):
            yield
    except ProblemError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's model
        how = f"the {policy.name} policy's autocast" if policy.autocast_dtype is not None else f"the {policy.name} policy"
        raise ProblemError(where, f"the model itself fails under {how} on {torch.device(device).type}: "
                                  f"{type(e).__name__}: {_first_line(e)}") from e


def level_of(path: "str | Path") -> int | None:
    """The KernelBench level a problem's path names (a folder "level<N>"), else None."""
    level = None
    for part in Path(path).parts:
        if part.startswith("level") and part[5:].isdigit():
            level = int(part[5:])
    return level


def load_problem(path: str | Path, small: bool = False) -> Problem:
    """Load a KernelBench-format file; `small=True` applies its `SMALL` size overrides."""
    path = Path(path)
    if not path.exists():
        raise ProblemError(path, "no such file")
    if path.is_dir():
        raise ProblemError(path, "is a folder, expected a problem file (.py)")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(path, f"cannot read: {e}") from e
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as e:
        raise ProblemError(path, f"syntax error at line {e.lineno}: {e.msg}") from e
    mod_name = f"kernelwright_problem_{next(_counter)}"
    module = types.ModuleType(mod_name)
    module.__file__ = str(path)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
    try:
        exec(code, module.__dict__)
    except Exception as e:  # noqa: BLE001 - user code
        raise ProblemError(path, f"importing raised {type(e).__name__}: {_first_line(e)}") from e
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        raise ProblemError(path, f"missing {', '.join(missing)} (KernelBench format needs Model, get_inputs, get_init_inputs)")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise ProblemError(path, "Model is not a torch.nn.Module subclass")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(module, fn)):
            raise ProblemError(path, f"{fn} is not callable")
    if small:
        overrides = getattr(module, "SMALL", None)
        if not isinstance(overrides, dict):
            raise ProblemError(path, "has no SMALL dict of size overrides, cannot shrink")
        for key, value in overrides.items():
            if key not in module.__dict__:
                raise ProblemError(path, f"SMALL names {key!r}, which the file does not define")
            module.__dict__[key] = value
    level = level_of(path)
    return Problem(
        name=path.stem,
        path=path,
        model_cls=module.Model,
        get_inputs=module.get_inputs,
        get_init_inputs=module.get_init_inputs,
        level=level,
        source=source,
        _module=module,
    )


def from_module(model: torch.nn.Module, example_inputs: list | tuple, name: str = "module",
                near: float | None = None) -> Problem:
    """Python API: a problem from a live module and example inputs.

    Fresh input sets keep the examples' shapes, dtypes and memory layouts (strides, where dense):
    floating tensors are redrawn from a standard normal, integer tensors uniformly from their
    observed range. With `near`, floating tensors are the examples' values plus normal noise of
    `near` times each example's standard deviation and other tensors the examples' values: for a
    graph whose inputs hold together (a backward graph's saved tensors: a softmax's log-sum-exp
    beside the scores it came from, a norm's reciprocal deviation), where independent draws make
    its values meaningless (an exponent that overflows). The problem's models are in the module's
    current training mode.
    """
    if not isinstance(model, torch.nn.Module):
        raise UserError("from_module: model must be a torch.nn.Module")
    examples = list(example_inputs)
    spread = [float(x.detach().double().std()) if near is not None and isinstance(x, torch.Tensor)
              and x.is_floating_point() and x.numel() > 1 else 1.0 for x in examples]

    def get_inputs():
        fresh = []
        for x, sd in zip(examples, spread):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and near is not None:
                noise = _like(x).normal_(0.0, near * (sd if math.isfinite(sd) and sd > 0 else 1.0))
                fresh.append(noise.add_(x.to(noise.device)))
            elif isinstance(x, torch.Tensor) and near is not None:
                fresh.append(_like(x).copy_(x))
            elif isinstance(x, torch.Tensor) and x.is_floating_point():
                fresh.append(_like(x).normal_())
            elif isinstance(x, torch.Tensor) and x.dtype != torch.bool and x.numel():
                lo, hi = int(x.min()), int(x.max())
                fresh.append(_like(x).random_(lo, hi + 1))
            elif isinstance(x, torch.Tensor):
                fresh.append(x.clone())
            else:
                fresh.append(x)
        return fresh

    return Problem(
        name=name,
        path=None,
        model_cls=type(model),
        get_inputs=get_inputs,
        get_init_inputs=lambda: [],
        training=model.training,
        _instance=model,
    )


def non_overlapping(shape, stride) -> bool:
    """Whether no two elements of a layout share memory (dense ones and views with gaps, such as q
    sliced from a fused qkv projection; not an expanded / stride-0 one): in the order of their
    strides, each dim of size > 1 steps past the whole extent of the ones before it."""
    dims = sorted((st, sh) for sh, st in zip(shape, stride) if sh != 1)
    extent = 1
    for st, sh in dims:
        if st < extent:
            return False
        extent = st * sh
    return True


def empty_like_strides(x: torch.Tensor, device=None) -> torch.Tensor:
    """An uninitialised tensor of x's shape and dtype on `device` (default: x's), with x's strides
    where no two elements share memory (a view with gaps too, as q sliced from a fused qkv
    projection: a module specialised for such strides is called with them), else contiguous."""
    device = x.device if device is None else device
    if x.numel() and not x.is_contiguous() and non_overlapping(x.shape, x.stride()):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=device)
    return torch.empty_like(x, device=device)


def _like(x: torch.Tensor) -> torch.Tensor:
    """`empty_like_strides` on the current default device."""
    return empty_like_strides(x, torch.get_default_device())


def discover(paths: list[str | Path]) -> list[Path]:
    """Problem files under the given files or folders, sorted; a missing path is a UserError."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*.py") if not q.name.startswith("_")))
        elif p.exists():
            found.append(p)
        else:
            raise ProblemError(p, "no such file or folder")
    return found
