"""The one way to load template files: a jinja2 environment over kernelwright's package resources.

Templates are named by their path inside the kernelwright package ("codegen/templates/triton/
group.py.j2", "emit/templates/model_new.py.j2"); `triton_template` and `cuda_template` name the
kernel templates by file name alone.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import jinja2


def _read(name: str) -> str:
    return resources.files("kernelwright").joinpath(*name.split("/")).read_text()


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The jinja2 environment of every template: blocks are trimmed (templates read like the code
    they produce), undefined variables are errors, and the `pyrepr` filter renders Python literals."""
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_read), trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["pyrepr"] = repr
    return env


def render(name: str, **context) -> str:
    """The template `name` (its path inside the kernelwright package) rendered with `context`."""
    return environment().get_template(name).render(**context)


def triton_template(name: str) -> jinja2.Template:
    return environment().get_template(f"codegen/templates/triton/{name}")


def cuda_template(name: str) -> jinja2.Template:
    return environment().get_template(f"codegen/templates/cuda/{name}")


def template_text(*path: str) -> str:
    """The raw text of a file under kernelwright/codegen/templates."""
    return _read("/".join(("codegen", "templates") + path))



@lru_cache(maxsize=None)
def template_env(package: str, *folder: str) -> jinja2.Environment:
    """A jinja2 environment reading templates from `package`'s resource folder `folder`."""
    root = resources.files(package).joinpath(*folder)
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: root.joinpath(name).read_text()),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["pyrepr"] = repr
    return env


def triton_env() -> jinja2.Environment:
    return template_env("kernelwright.codegen", "templates", "triton")


def launch_helpers() -> str:
    """`_alloc` and `_expect`, appended to every generated launcher module (templates/launch_helpers.py,
    without its own header: the module it joins already imports torch)."""
    return "\n\n" + template_text("launch_helpers.py").split("\n\n", 1)[1].lstrip("\n")
