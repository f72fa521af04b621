"""The one way a rendered kernel module gets the shared helpers it uses: `with_helpers`.

Host helpers (codegen/host.py: `_alloc`, `_expect`, `_launch`, ...) are imported, by the names the
module calls, from kernels/_host.py beside it in an emitted folder, or from kernelwright when the
tuner loads the module on its own; the Triton device helpers (templates/triton/device_helpers.py:
`kw_tanh`, `kw_round_bf16`, ...) the module references are defined in it, with what they use.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache

from kernelwright.codegen.templating import template_text

HOST = ("_alloc", "_cdiv", "_expect", "_launch", "_scratch", "_epilogue_args", "_tma_descriptors")
HOST_MODULE = "_host"  # the copy of codegen/host.py in an emitted kernels/ folder


@dataclass(frozen=True)
class Block:
    """One top-level definition of the device helpers: its name, text (with the comment above it)
    and the other helpers and modules it uses."""

    name: str
    text: str
    uses: frozenset[str]


def names_used(text: str) -> set[str]:
    """The names `text` (Python source) uses as code: not in comments or strings."""
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            out.add(tok.string)
    return out


@lru_cache(maxsize=None)
def device_library() -> tuple[Block, ...]:
    """The definitions of templates/triton/device_helpers.py, in file order."""
    text = template_text("triton", "device_helpers.py")
    lines = text.splitlines(keepends=True)
    blocks = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.Assign)):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            while start > 0 and lines[start - 1].startswith("#"):
                start -= 1
            name = node.name if isinstance(node, ast.FunctionDef) else node.targets[0].id  # type: ignore[attr-defined]
            body = "".join(lines[start:node.end_lineno]).rstrip()
            blocks.append(Block(name, body, frozenset(names_used("".join(lines[node.lineno - 1:node.end_lineno])))))
    return tuple(blocks)


def _host_block(node) -> bool:
    """Whether top-level statement `node` is the import of the host helpers (`_host_import`)."""
    return isinstance(node, ast.Try) and bool(node.body) and isinstance(node.body[0], ast.ImportFrom) \
        and node.body[0].module == HOST_MODULE and node.body[0].level == 1


def _bound(tree: ast.Module) -> set[str]:
    """Names the module binds at top level (definitions, assignments, imports)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def _host_import(names: list[str]) -> str:
    listed = ", ".join(names)
    return (f"try:\n    from .{HOST_MODULE} import {listed}  # kernels/{HOST_MODULE}.py beside this file\n"
            f"except ImportError:  # this file loaded on its own, as kernelwright's tuner loads it\n"
            f"    from kernelwright.codegen.host import {listed}\n")


def with_helpers(text: str) -> str:
    """`text` (a rendered kernel module) importing the host helpers it calls and defining the device
    helpers it references (and those they use), after its imports; a module already holding some
    gets the ones it lacks."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    host_nodes = [n for n in tree.body if _host_block(n)]
    had = {a.name for n in host_nodes for a in n.body[0].names}  # type: ignore[attr-defined]
    for n in reversed(host_nodes):  # (with the two blank lines `with_helpers` put above it)
        start = n.lineno - 1
        while start > 0 and n.lineno - 1 - start < 2 and not lines[start - 1].strip():
            start -= 1
        del lines[start:n.end_lineno]
    rest = "".join(lines)
    tree = ast.parse(rest)
    bound = _bound(tree)
    used = names_used(rest)
    host = [n for n in HOST if (n in used or n in had) and n not in bound]
    library = {b.name: b for b in device_library()}
    need = {n for n in used if n in library and n not in bound}
    grow = list(need)
    while grow:
        for dep in library[grow.pop()].uses:
            if dep in library and dep not in need and dep not in bound:
                need.add(dep)
                grow.append(dep)
    blocks = [b.text for b in device_library() if b.name in need]
    imports = "import os\n\n" if any("os" in library[n].uses for n in need) and "os" not in bound else ""
    parts = ([_host_import(host).rstrip()] if host else []) + blocks
    if not parts and not imports:
        return rest
    lines = rest.splitlines(keepends=True)
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
    first = last = None
    for node in body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        first = first if first is not None else node
        last = node
    at = last.end_lineno if last is not None else (tree.body[0].end_lineno if body is not tree.body else 0)
    section = ("\n\n" + "\n\n\n".join(parts) + "\n") if parts else ""
    out = "".join(lines[:at]) + section + "".join(lines[at:])
    if imports:
        top = first.lineno - 1 if first is not None else at
        out = "".join(out.splitlines(keepends=True)[:top]) + imports + "".join(out.splitlines(keepends=True)[top:])
    return out


def launch_out_params(source: str) -> set[int]:
    """The outputs (positions) whose buffer a kernel module's launch() accepts as `out<i>=`: a value
    computed into a concatenation's slice (plan.concat) is written there directly."""
    at = source.rfind("\ndef launch(")
    if at < 0:
        return set()
    head = source[at:source.find(")", at)]
    return {int(i) for i in re.findall(r"\bout(\d+)=None", head)}
