"""The import graph of kernelwright's stage packages runs one way: a module imports only from its
own layer or a lower one.

Every module under src/kernelwright is parsed with ast and every import is read, function-local
ones included, so a deferred import cannot hide an upward edge. A stage is the first name below
`kernelwright` (a subpackage such as `plan`, or a top-level module such as `cli`).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kernelwright"

# lowest first; a stage may import from its own layer and from every layer before it
LAYERS = [
    {"errors", "devices", "policy", "problem"},
    {"capture"},
    {"analyze", "ops"},
    {"plan"},
    {"space"},
    {"build"},  # codegen compiles the CUDA runtime through build
    {"codegen"},
    {"verify"},
    {"measure"},
    {"search"},
    {"emit"},
    {"pipeline"},
    {"bench"},  # drives the whole pipeline
    # `__init__`: optimize(); `backend`: torch.compile's; `fuzz`: drives the pipeline and the backend
    {"cli", "__main__", "doctor", "__init__", "backend", "fuzz"},
]

# names the package root defines before any import; any layer may read them
ROOT_CONSTANTS = {"__version__"}

# (importing module, imported module): upward edges kept on purpose
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

RANK = {stage: i for i, layer in enumerate(LAYERS) for stage in layer}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = ("kernelwright",) + path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        name, is_pkg = _module_name(path)
        found[name] = (path, is_pkg)
    return found


MODULES = _modules()


def _imports(name: str, path: Path, is_pkg: bool):
    """(imported kernelwright module, line, names) for every import in the module, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names = tuple(a.name for a in node.names)
            # `from kernelwright.codegen import node_kernels` imports a module: count that one
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
            rest = tuple(n for n in names if f"{module}.{n}" not in MODULES)
            for sub in subs:
                yield sub, node.lineno, ()
            if rest or not subs:
                yield module, node.lineno, rest


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges():
    """(importer, imported, line, stage of importer, stage of imported) across stages."""
    for name, (path, is_pkg) in MODULES.items():
        for target, line, names in _imports(name, path, is_pkg):
            if target.split(".")[0] != "kernelwright":
                continue
            if target == "kernelwright" and names and set(names) <= ROOT_CONSTANTS:
                continue
            src, dst = _stage(name), _stage(target)
            if src != dst:
                yield name, target, line, src, dst


def upward_edges(edges) -> list[str]:
    bad = []
    for name, target, line, src, dst in edges:
        if RANK[dst] > RANK[src] and (name, target) not in KNOWN_EXCEPTIONS:
            bad.append(f"{name}:{line} imports {target} ({src} is below {dst})")
    return bad


def test_every_stage_has_a_layer():
    stages = {_stage(name) for name in MODULES}
    assert stages - set(RANK) == set(), "add the new stage to LAYERS"
    assert set(RANK) - stages == set(), "LAYERS names a stage that no longer exists"


def test_imports_run_down_the_layers():
    assert upward_edges(_edges()) == []


def test_known_exceptions_are_still_needed():
    seen = {(name, target) for name, target, *_ in _edges()}
    assert set(KNOWN_EXCEPTIONS) <= seen, "drop the exceptions that no longer occur"


def test_package_root_imports_only_inside_functions():
    """Reading a root constant (ROOT_CONSTANTS) from a low layer must not load the stages above."""
    path, _ = MODULES["kernelwright"]
    top = [n.lineno for n in ast.parse(path.read_text()).body
           if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom) and n.module != "__future__")]
    assert top == []


def test_stage_graph_is_acyclic():
    graph: dict[str, set[str]] = {}
    for name, target, _, src, dst in _edges():
        if (name, target) not in KNOWN_EXCEPTIONS:
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def visit(stage: str, path: list[str]):
        state[stage] = 1
        for nxt in sorted(graph.get(stage, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(path + [stage, nxt]))
            if nxt not in state:
                visit(nxt, path + [stage])
        state[stage] = 2

    for stage in sorted(graph):
        if stage not in state:
            visit(stage, [])


def test_a_plan_to_codegen_import_is_caught(tmp_path):
    """The check itself: a function-local import of codegen in a plan module is reported."""
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from kernelwright.codegen.triton_ops import POINTWISE\n")
    probe = "kernelwright.plan.probe"
    extra = [(probe, target, line, "plan", _stage(target)) for target, line, _ in _imports(probe, path, False)]
    assert upward_edges(extra) == [f"{probe}:2 imports kernelwright.codegen.triton_ops (plan is below codegen)"]
