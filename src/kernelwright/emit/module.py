"""Write `model_new.py` (class ModelNew) and its kernel files into an output folder."""
from __future__ import annotations

import datetime
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelwright import __version__
from kernelwright.codegen.templating import template_env
from kernelwright.emit.program import forward_text, state_reads
from kernelwright.plan.fusion import Plan
from kernelwright.problem import Problem


def single_output(plan: Plan) -> bool:
    """Whether the original forward returned a bare tensor (not a tuple)."""
    ep = plan.graph.exported
    spec = getattr(getattr(ep, "call_spec", None), "out_spec", None)
    if spec is None or len(plan.graph.outputs) != 1:
        return len(plan.graph.outputs) == 1
    leaf = getattr(spec, "is_leaf", None)
    return bool(leaf()) if callable(leaf) else spec.num_children == 0


@dataclass
class ModeForward:
    """One generated forward: the training mode it serves ("train", "eval", or "any" when the
    model's result does not depend on its mode), its plan, and the kernels its units run
    (`kernels`: unit name -> (kernel file name, input names, output names, whether launch()
    returns the node's whole tuple), or None for a unit computed inside another's kernel)."""

    mode: str
    plan: Plan
    kernels: dict[str, tuple | None] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # kernel file name -> its text
    summary: list[str] = field(default_factory=list)
    support: dict[str, str] = field(default_factory=dict)  # support files beside the kernels
    # the training flags of the mode-dependent submodules (render_model_new's `mode_modules`) this
    # forward answers for: one tuple per mode it was captured and verified in; [()] without any
    keys: list[tuple[bool, ...]] = field(default_factory=lambda: [()])

    @property
    def prefix(self) -> str:
        """Prefix of this forward's kernel files: a module may hold a forward per mode."""
        return "" if self.mode == "any" else f"{self.mode}_"


def _kernels_and_support(forwards: list[ModeForward]) -> tuple[dict[str, str], dict[str, str]]:
    """The files of kernels/ for `forwards`: (kernels, named with their mode's prefix; support files)."""
    kernels = {f.prefix + name: text for f in forwards for name, text in f.sources.items()}
    support = {name: text for f in forwards for name, text in f.support.items()}
    return kernels, support


def module_files(forwards: list[ModeForward]) -> dict[str, str]:
    """Every file of kernels/ for `forwards`: kernels (prefixed by mode) and support files."""
    kernels, support = _kernels_and_support(forwards)
    return {**support, **kernels}


def call_signature(plan: Plan) -> list[tuple[tuple, tuple, str]]:
    """(shape, strides, dtype) of each user input the plan was specialised for."""
    return [(tuple(i.meta.shape), tuple(i.meta.stride), i.meta.dtype) for i in plan.graph.user_inputs]


def render_model_new(problem: Problem, forwards: list[ModeForward], policy: str, overrides: dict | None,
                     mode_modules: list[str] | tuple = (), cuda_graphs: bool = False,
                     device_type: str | None = None, notes: list[str] | tuple = ()) -> str:
    """The text of model_new.py: ModelNew (or attach()) whose forward runs, for a call like the
    one it was specialised for, the generated forward of the module's training mode, and the
    original forward for any other call. No forwards: the original forward always.
    `mode_modules`: the submodules whose result depends on their training flag (capture.modes).
    `cuda_graphs`: the forward replays CUDA graphs (under no_grad, on CUDA inputs). `device_type`:
    the device the kernels run on (default: cuda when a GPU is visible, else cpu). `notes` head the
    file's list of units (e.g. why a mode runs the original forward)."""
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    rendered = []
    for f in forwards:
        mods = {key: (None if k is None else (f"_k_{f.prefix}{k[0]}", k[1], k[2], k[3])) for key, k in f.kernels.items()}
        g = f.plan.graph
        rendered.append({"mode": f.mode, "flags": [tuple(k) for k in f.keys],
                         "forward": forward_text(f.plan, mods, single_output(f.plan), f.mode),
                         "state": state_reads(f.plan), "dtypes": [i.meta.dtype for i in g.inputs if i.kind in ("param", "buffer")]})
    summary = list(notes) + ([f"{f.mode}: {line}" if f.mode != "any" else line for f in forwards for line in f.summary]
                             or ["(the original forward)"])
    if forwards:
        args = ", ".join(i.name for i in forwards[0].plan.graph.user_inputs)
        signature = call_signature(forwards[0].plan)
    else:
        args, signature = "", []
    kernel_files, support = _kernels_and_support(forwards)
    return template_env("kernelwright.emit", "templates").get_template("model_new.py.j2").render(
        version=__version__, date=datetime.date.today().isoformat(), problem=problem.name, policy=policy,
        summary=summary, source=(problem.source or "").rstrip(), overrides=sorted((overrides or {}).items()),
        kernel_sources=sorted(kernel_files.items()), support=sorted(support.items()), args=args,
        forwards=rendered, has_model=bool(problem.source), cuda_graphs=bool(cuda_graphs and forwards),
        mode_modules=tuple(mode_modules), signature=signature, device_type=device_type)


def write_module(out_dir: Path, text: str, kernel_sources: dict[str, str], support: dict[str, str] | None = None) -> Path:
    """Write model_new.py, kernels/*.py and support files beside them; returns the model_new.py path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kdir = out_dir / "kernels"
    kdir.mkdir(exist_ok=True)
    for old in kdir.glob("*.py"):
        old.unlink()
    for name, src in {**(support or {}), **kernel_sources}.items():
        (kdir / f"{name}.py").write_text(src)
    path = out_dir / "model_new.py"
    path.write_text(text)
    return path


_count = [0]


def import_model_new(path: Path):
    """Import an emitted model_new.py as a fresh module."""
    _count[0] += 1
    name = f"kw_model_new_{_count[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def model_new_like(mod, problem: Problem, reference: torch.nn.Module, device) -> torch.nn.Module:
    """The emitted module `mod`'s ModelNew, built from `problem`'s init inputs on `device`, with
    `reference`'s weights; for a Python-API problem (no ModelNew) the new forward attached to a
    copy of `reference`."""
    if not hasattr(mod, "ModelNew"):
        import copy

        return mod.attach(copy.deepcopy(reference))
    with torch.device(device):
        m = mod.ModelNew(*problem.get_init_inputs())
    m.load_state_dict(reference.state_dict())
    m = m.to(device)
    modes = dict(reference.named_modules())
    for name, sub in m.named_modules():  # every submodule's own flag (a frozen norm stays frozen)
        if name in modes:
            sub.training = modes[name].training
    return m
