"""Write `model_new.py` (class ModelNew) and its kernel files into an output folder."""
from __future__ import annotations

import datetime
import importlib.util
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from kernelwright import __version__
from kernelwright.capture.export import output_structure
from kernelwright.codegen.templating import render
from kernelwright.codegen.helpers import launch_out_params
from kernelwright.emit.program import STATE, attribute_shapes, forward_text, state_reads
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


def result_builder(plan: Plan) -> str | None:
    """The expression over `out` (the generated forward's tuple of tensors) that builds the model's
    output from them where it returns dicts, lists, nested tuples or Nones; None where the forward
    returns the model's result as it is (one tensor, or a flat tuple of them)."""
    if plan.graph.exported is None:
        return None
    spec, nones = output_structure(plan.graph.exported)
    if not nones and (spec.is_leaf() or (spec.type is tuple and all(c.is_leaf() for c in spec.children()))):
        return None
    leaf, tensor = iter(range(spec.num_leaves)), iter(range(len(plan.graph.outputs)))

    def build(s) -> str:
        if s.is_leaf():
            return "None" if next(leaf) in nones else f"out[{next(tensor)}]"
        items = [build(c) for c in s.children()]
        if s.type is dict:
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(s.context, items)) + "}"
        if s.type is list:
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return build(spec)


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


def call_signature(plan: Plan) -> list[tuple]:
    """(shape, strides, dtype) of each tensor user input the plan was specialised for; ("=", value)
    of a number."""
    return [("=", i.value) if i.meta is None else (tuple(i.meta.shape), tuple(i.meta.stride), i.meta.dtype)
            for i in plan.graph.user_inputs]


def _wrap(items: list[str], indent: int, width: int = 116) -> str:
    """`items` joined by ", ", broken into lines of at most `width` characters, continuation
    lines indented by `indent` spaces."""
    lines, line = [], ""
    for item in items:
        if line and indent + len(line) + len(item) + 2 > width:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def _tuple(items: list[str], indent: int) -> str:
    """A tuple display of `items` (wrapped, inside its parentheses)."""
    return _wrap(items, indent) + ("," if len(items) == 1 else "")


def _dtypes(dtypes: list[str]) -> str:
    if dtypes and len(set(dtypes)) == 1:
        return f"(torch.{dtypes[0]},) * {len(dtypes)}"
    return "(" + _tuple([f"torch.{d}" for d in dtypes], 0) + ")"


def _imports(source: str | None) -> list[str]:
    """The imports model_new.py's own code needs that the problem's code does not make."""
    have = set(re.findall(r"^import [\w.]+(?: as \w+)?$", source or "", re.M))
    return [line for line in ("import torch",) if line not in have]


def render_model_new(problem: Problem, forwards: list[ModeForward], policy: str, overrides: dict | None,
                     mode_modules: list[str] | tuple = (), cuda_graphs: bool = False,
                     device_type: str | None = None, notes: list[str] | tuple = ()) -> str:
    """The text of model_new.py: ModelNew (or attach()) whose forward runs, for a call like the
    one it was specialised for, the generated forward of the module's training mode, and the
    original forward for any other call (the runtime's Specialised, emit/runtime.py). No forwards:
    the original forward always. `mode_modules`: the submodules whose result depends on their
    training flag (capture.modes). `cuda_graphs`: the forward replays CUDA graphs (under no_grad, on
    CUDA inputs; the module then imports kernels/_graphs.py). `device_type`: the device the kernels
    run on (default: cuda when a GPU is visible, else cpu). `notes` head the file's list of units
    (e.g. why a mode runs the original forward)."""
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    readers: dict[tuple, str] = {}  # the parameters and buffers a forward reads -> its reader's name
    for f in forwards:
        readers.setdefault(tuple(state_reads(f.plan)), f"_kw_tensors_{f.mode}")
    if len(readers) == 1:
        readers = {key: "_kw_tensors" for key in readers}
    tensors = [{"name": name, "fast": _tuple([fast for _, fast, _ in key], 16),
                "attrs": _tuple([attr for _, _, attr in key], 16)} for key, name in readers.items()]
    rendered, records = [], []
    copies = False  # a forward copies values into a concatenation's buffer (kernels/_copy.py)
    result = result_builder(forwards[0].plan) if forwards else None
    for f in forwards:
        mods = {key: (None if k is None else (f"_k_{f.prefix}{k[0]}", k[1], k[2], k[3])) for key, k in f.kernels.items()}
        reader = readers[tuple(state_reads(f.plan))]
        outs = {key: launch_out_params(f.sources.get(k[0], "")) for key, k in f.kernels.items() if k is not None}
        text = forward_text(f.plan, mods, single_output(f.plan) and result is None, f.mode, tensors=reader,
                            out_params=outs)
        rendered.append({"mode": f.mode, "forward": text})
        copies = copies or any("_cp." in line for line in text.body)
        dtypes = _dtypes([i.meta.dtype for i in f.plan.graph.inputs if i.kind in STATE])
        run = (f"compute=_kw_compute_{f.mode}, commit=_kw_commit_{f.mode}" if text.commit
               else f"_kw_forward_{f.mode}")
        shapes = attribute_shapes(f.plan)
        run += f", shapes={shapes!r}" if shapes else ""
        records.append(f"_rt.Forward({json.dumps(f.mode)}, {[tuple(k) for k in f.keys]}, {reader}, {dtypes}, {run})")
    summary = list(notes) + ([f"{f.mode}: {line}" if f.mode != "any" else line for f in forwards for line in f.summary]
                             or ["(the original forward)"])
    if forwards:
        args = ", ".join(i.name for i in forwards[0].plan.graph.user_inputs)
        signature = [repr(s) if s[0] == "=" else f"(torch.Size({s[0]}), {s[1]}, torch.{s[2]})"
                     for s in call_signature(forwards[0].plan)]
    else:
        args, signature = "", []
    kernel_files, _ = _kernels_and_support(forwards)
    return render("emit/templates/model_new.py.j2",
                  version=__version__, date=datetime.date.today().isoformat(), problem=problem.name, policy=policy,
                  summary=summary, source=(problem.source or "").rstrip(), imports=_imports(problem.source),
                  overrides=sorted((overrides or {}).items()), kernels=[(f"_k_{name}", name) for name in sorted(kernel_files)],
                  args=args, tensors=tensors, forwards=rendered, copies=copies, forward_records=records, has_model=bool(problem.source),
                  cuda_graphs=bool(cuda_graphs and forwards), mode_modules=tuple(mode_modules), signature=signature,
                  device_type=device_type, result=result, files=None)


# kernels/ files the runtime is made of: name -> (package, file); each ships where a module imports it
RUNTIME = {"_runtime": ("kernelwright.emit", "runtime.py"), "_graphs": ("kernelwright.emit", "graphs.py"),
           "_host": ("kernelwright.codegen", "host.py"), "_copy": ("kernelwright.codegen", "slice_copy.py")}


def runtime_files(text: str, sources: dict[str, str]) -> dict[str, str]:
    """The runtime files kernels/ needs beside `sources` for model_new.py's `text`: each one that
    model_new.py (`_kw_import("_runtime")`), one of the files or a runtime file shipped for them
    (`from ._host import ...`) imports."""
    wanted = set(re.findall(r'_kw_import\("(\w+)"\)', text))
    texts = list(sources.values())
    files: dict[str, str] = {}
    while True:
        for src in texts:
            wanted.update(re.findall(r"^\s*from \.(\w+) import", src, re.M))
        new = {name: resources.files(pkg).joinpath(file).read_text()
               for name, (pkg, file) in RUNTIME.items() if name in wanted and name not in files}
        if not new:
            return files
        files.update(new)
        texts = list(new.values())


def write_module(out_dir: Path, text: str, kernel_sources: dict[str, str], support: dict[str, str] | None = None) -> Path:
    """Write model_new.py, kernels/*.py, their support files and the runtime files they import
    (runtime_files) beside them; returns the model_new.py path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kdir = out_dir / "kernels"
    kdir.mkdir(exist_ok=True)
    for old in kdir.glob("*.py"):
        old.unlink()
    files = {**(support or {}), **kernel_sources}
    for name, src in {**runtime_files(text, files), **files}.items():
        (kdir / f"{name}.py").write_text(src)
    path = out_dir / "model_new.py"
    path.write_text(text)
    return path


def single_file(out_dir: Path) -> Path:
    """Fold kernels/ into model_new.py (`optimize --single-file`): the file then embeds every
    file of kernels/ and writes them to a folder of its own when imported; kernels/ is removed."""
    out_dir = Path(out_dir)
    path, kdir = out_dir / "model_new.py", out_dir / "kernels"
    files = sorted((p.stem, p.read_text()) for p in kdir.glob("*.py"))
    text = path.read_text()
    folder, embedded = (render("emit/templates/loader.py.j2", files=f) for f in (None, files))
    if folder not in text:
        raise ValueError(f"{path} does not load kernels/ as kernelwright writes it")
    path.write_text(text.replace(folder, embedded))
    shutil.rmtree(kdir)
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
    mine = dict(m.named_modules())
    for name, sub in reference.named_modules():  # tensor attributes (not in the state_dict): the reference's
        for key, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and name in mine and key in vars(mine[name]):
                setattr(mine[name], key, value.detach().clone())
    modes = dict(reference.named_modules())
    for name, sub in m.named_modules():  # every submodule's own flag (a frozen norm stays frozen)
        if name in modes:
            sub.training = modes[name].training
    return m
