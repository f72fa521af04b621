"""Write `model_new.py` (class ModelNew) and its kernel files into an output folder."""
from __future__ import annotations

import datetime
import importlib.util
import sys
from pathlib import Path

import torch

from kernelwright import __version__
from kernelwright.codegen.templating import template_env
from kernelwright.emit.program import ForwardText, forward_text, state_reads
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


def render_model_new(problem: Problem, plan: Plan | None, kernels: dict[str, tuple],
                     kernel_sources: dict[str, str], policy: str, summary: list[str], overrides: dict | None,
                     support: dict[str, str] | None = None, cuda_graphs: bool = False) -> str:
    """The text of model_new.py. With no plan (capture failed) ModelNew is the original Model.
    `support` files (e.g. the CUDA runtime) sit beside the kernels and are embedded too.
    `cuda_graphs`: the forward replays CUDA graphs (under no_grad, on CUDA inputs)."""
    has_model = bool(problem.source)
    state: list[str] = []
    if plan is None:
        cuda_graphs = False
        args = "*args"
        call = "return super().forward(*args)" if has_model else "return type(self).forward(self, *args)"
        body = [call]
        if policy == "bf16":  # the original forward at matched precision: as eager runs it, in bf16 autocast
            body = ["_dt = next((a.device.type for a in args if isinstance(a, torch.Tensor)), 'cuda')",
                    "with torch.autocast(device_type=_dt, dtype=torch.bfloat16):", "    " + call]
        text = ForwardText(body, "", [], [])  # (the body returns)
    else:
        args = ", ".join(i.name for i in plan.graph.user_inputs)
        mods = {key: (None if k is None else (f"_k_{k[0]}", k[1], k[2], k[3])) for key, k in kernels.items()}
        text = forward_text(plan, mods, single_output(plan))
        state = state_reads(plan)
    return template_env("kernelwright.emit", "templates").get_template("model_new.py.j2").render(
        version=__version__, date=datetime.date.today().isoformat(), problem=problem.name, policy=policy,
        summary=summary, source=(problem.source or "").rstrip(), overrides=sorted((overrides or {}).items()),
        kernel_sources=sorted(kernel_sources.items()), support=sorted((support or {}).items()), args=args,
        forward=text, has_model=has_model, cuda_graphs=bool(cuda_graphs), state=state)


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
    return m.to(device)
