"""Fused epilogues for the GEMM / convolution templates.

The contract (shared with the pointwise code generator):

* An :class:`Epilogue` is a tuple of :class:`EpilogueOperand` and a block of Triton statements
  (``code``).  The statements read ``acc`` (the ``[BLOCK_M, BLOCK_N]`` float32 accumulator of the
  output tile) and one variable per operand, named after the operand (``e0``, ``e1``, ...), each
  already loaded as float32 and broadcastable against ``acc``; they must assign the final value
  to ``acc``.  The template then stores ``acc`` (cast to the output's element type).
* Operand kinds and what the template loads for them:

  ========  =====================================================  ======================
  kind      meaning                                                 loaded as
  ========  =====================================================  ======================
  col       one value per output column n (a bias, per channel)    ``[1, BLOCK_N]``
  row       one value per output row m                             ``[BLOCK_M, 1]``
  full      same logical shape as the output (residual)            ``[BLOCK_M, BLOCK_N]``
  scalar    a 0-d tensor                                           a scalar
  ========  =====================================================  ======================

  Kernel parameters per operand (see :func:`operand_params`): ``{name}_ptr`` always; for
  ``full`` operands one stride per output dimension, ``stride_{name}_{dim}`` (``m``/``n`` for a
  GEMM; the conv templates use the NCHW output's ``n``/``c``/``h``/``w``), so broadcast views
  (stride 0) need no copy; for batched GEMMs ``col``/``row``/``full`` also get
  ``stride_{name}_b`` (0 when the operand is shared by all batches).  ``col``/``row`` operands
  are read with unit stride (launchers make them contiguous, which costs at most N elements).
* Masked-out lanes of the tile are loaded as 0.0; the template never stores them, so the
  epilogue code need not care about them (division by such a 0 produces inf/nan in lanes
  that are thrown away).

The generated modules import ``triton``, ``triton.language as tl`` and ``libdevice``
(``triton.language.extra.libdevice``), so the epilogue code may use all three.
"""
from __future__ import annotations

import keyword
import textwrap
from dataclasses import dataclass

KINDS = ("col", "row", "full", "scalar")

# Names the templates use themselves; an operand must not shadow them.
RESERVED = frozenset(
    {
        "acc", "a", "b", "c", "M", "N", "K", "pid", "mask", "offs_m", "offs_n", "offs_k",
        "tl", "triton", "libdevice", "x", "w", "y", "out",
    }
)


@dataclass(frozen=True)
class EpilogueOperand:
    name: str  # parameter name in the kernel, e.g. "e0"; the loaded value has this name
    kind: str  # "col" | "row" | "full" | "scalar"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"epilogue operand kind {self.kind!r} not in {KINDS}")
        if not self.name.isidentifier() or keyword.iskeyword(self.name) or self.name in RESERVED:
            raise ValueError(f"bad epilogue operand name {self.name!r}")


@dataclass(frozen=True)
class Epilogue:
    operands: tuple[EpilogueOperand, ...] = ()
    code: str = ""  # Triton statements reading `acc` and the operands, assigning `acc`

    def __post_init__(self):
        names = [o.name for o in self.operands]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate epilogue operand names: {names}")
        object.__setattr__(self, "operands", tuple(self.operands))

    @property
    def empty(self) -> bool:
        return not self.operands and not self.code.strip()

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.operands]


IDENTITY = Epilogue()


def operand_params(epilogue: Epilogue, *, full_strides=("m", "n"), batched: bool = False) -> list[str]:
    """Kernel parameter names for the epilogue operands, in order."""
    out: list[str] = []
    for op in epilogue.operands:
        out.append(f"{op.name}_ptr")
        if op.kind == "full":
            out += [f"stride_{op.name}_{d}" for d in full_strides]
        if batched and op.kind != "scalar":
            out.append(f"stride_{op.name}_b")
    return out


def render_operand_loads(
    epilogue: Epilogue,
    offs_m: str = "offs_m",
    offs_n: str = "offs_n",
    mask: str = "mask",
    *,
    mask_m: str | None = None,
    mask_n: str | None = None,
    full_offsets: str | None = None,
    batch: str | None = None,
    indent: str = "    ",
) -> str:
    """Triton statements that load every operand of ``epilogue`` as float32 under its own name.

    ``offs_m``/``offs_n`` name the 1-D row/column index vectors of the tile in the kernel,
    ``mask`` the 2-D in-bounds mask; ``mask_m``/``mask_n`` the 1-D masks (default
    ``offs_m < M`` / ``offs_n < N``).  ``full_offsets`` is the element-offset expression of a
    ``full`` operand, with ``{name}`` standing for the operand's name (default: the GEMM's
    ``offs_m[:, None] * stride_{name}_m + offs_n[None, :] * stride_{name}_n``).  ``batch``
    names the batch index variable for batched kernels (adds ``batch * stride_{name}_b``).
    """
    mask_m = mask_m or f"{offs_m} < M"
    mask_n = mask_n or f"{offs_n} < N"
    if full_offsets is None:
        full_offsets = f"{offs_m}[:, None] * stride_{{name}}_m + {offs_n}[None, :] * stride_{{name}}_n"
    lines: list[str] = []
    for op in epilogue.operands:
        n = op.name
        base = f"{n}_ptr" if batch is None or op.kind == "scalar" else f"{n}_ptr + {batch} * stride_{n}_b"
        if op.kind == "col":
            lines.append(f"{n} = tl.load({base} + {offs_n}, mask={mask_n}, other=0.0).to(tl.float32)[None, :]")
        elif op.kind == "row":
            lines.append(f"{n} = tl.load({base} + {offs_m}, mask={mask_m}, other=0.0).to(tl.float32)[:, None]")
        elif op.kind == "full":
            offs = full_offsets.replace("{name}", n)
            lines.append(f"{n} = tl.load({base} + {offs}, mask={mask}, other=0.0).to(tl.float32)")
        else:  # scalar
            lines.append(f"{n} = tl.load({base}).to(tl.float32)")
    return textwrap.indent("\n".join(lines), indent) if lines else ""


def render_code(epilogue: Epilogue, indent: str = "    ") -> str:
    """The epilogue statements, re-indented for pasting into a kernel body ('' when empty)."""
    code = textwrap.dedent(epilogue.code).strip("\n")
    return textwrap.indent(code, indent) if code.strip() else ""


# Common epilogues, handy for tests and for callers that do not build their own.
def bias_relu(name: str = "e0") -> Epilogue:
    return Epilogue((EpilogueOperand(name, "col"),), f"acc = acc + {name}\nacc = tl.maximum(acc, 0.0)")


def bias(name: str = "e0") -> Epilogue:
    return Epilogue((EpilogueOperand(name, "col"),), f"acc = acc + {name}")


__all__ = [
    "KINDS", "EpilogueOperand", "Epilogue", "IDENTITY", "operand_params", "render_operand_loads",
    "render_code", "bias", "bias_relu",
]
