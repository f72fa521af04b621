"""One way to load template files: jinja2 environments over package resources (no paths)."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import jinja2


@lru_cache(maxsize=None)
def template_env(package: str, *folder: str) -> jinja2.Environment:
    """A jinja2 environment reading templates from `package`'s resource folder `folder`.

    Blocks are trimmed (templates read like the code they produce), undefined variables are
    errors, and the `pyrepr` filter renders Python literals."""
    root = resources.files(package).joinpath(*folder)
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["pyrepr"] = repr
    return env


def triton_env() -> jinja2.Environment:
    return template_env("kernelwright.codegen", "templates", "triton")


def template_text(*path: str) -> str:
    """The raw text of a file under kernelwright/codegen/templates."""
    return resources.files("kernelwright.codegen").joinpath("templates", *path).read_text()


def launch_helpers() -> str:
    """`_alloc` and `_expect`, appended to every generated launcher module (templates/launch_helpers.py,
    without its own header: the module it joins already imports torch)."""
    return "\n\n" + template_text("launch_helpers.py").split("\n\n", 1)[1].lstrip("\n")
