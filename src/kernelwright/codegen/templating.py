"""The one way to load template files: a jinja2 environment over kernelwright's package resources.

Templates are named by their path inside the kernelwright package ("codegen/templates/triton/
group.py.j2", "emit/templates/model_new.py.j2"); `triton_template` and `cuda_template` name the
kernel templates by file name alone. The `call_args` filter turns a signature into its call.
"""
from __future__ import annotations

import textwrap
from functools import lru_cache
from importlib import resources

import jinja2


def _read(name: str) -> str:
    return resources.files("kernelwright").joinpath(*name.split("/")).read_text()


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The jinja2 environment of every template: blocks are trimmed (templates read like the code
    they produce), undefined variables are errors, the `pyrepr` filter renders Python literals and
    `call_args` the argument list that passes a signature's parameters on."""
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_read), trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["pyrepr"] = repr
    env.filters["call_args"] = call_args
    return env


def call_args(signature: str, indent: int = 0, width: int = 110) -> str:
    """The parameter names of a function signature's text ("a, B: tl.constexpr,\n c"), in
    order, as a call's arguments ("a, B, c"; lines wrapped at `width`, continued at `indent`
    spaces): a kernel passing its parameters on to a helper."""
    names = [p.split(":")[0].strip() for p in signature.replace("\n", " ").split(",")]
    return textwrap.fill(", ".join(n for n in names if n), width, subsequent_indent=" " * indent,
                         break_on_hyphens=False)


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

