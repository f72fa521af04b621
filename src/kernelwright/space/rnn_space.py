"""Schedule space of the persistent recurrent-layer kernel (codegen/triton_rnn.py).

One launch runs a whole layer: D program groups (one per direction), each of P programs owning
BLOCK_H hidden units (every gate of them), so P = ceil(H / BLOCK_H). The programs of a group meet
at a grid-wide barrier after every time step, so all D * P programs must be resident at once:
P * D is at most the device's SM count (`DeviceSpec.sms`; one program per SM, each free to use
a whole SM's registers). Where co-residency cannot be shown (the Triton interpreter runs programs
one after another, so a second program would wait forever for the first) P is 1.

Axes:

* ``BLOCK_H``: hidden units per program (hence P).
* ``RESIDENT``: whether the program's slice of W_hh (G gates x BLOCK_H rows x H columns) is loaded
  into registers once, before the time loop, or streamed from L2 in BLOCK_K-column chunks every
  step. Resident slices must fit half the SM's register file (`DeviceSpec.regs_per_sm`) and at
  most 128 registers per thread.
* ``DOT``: the matrix-vector product h_{t-1} @ W_hh^T in IEEE float32, as a broadcast multiply
  + sum (``"fma"``) or as ``tl.dot(input_precision="ieee")`` (``"ieee"``), the only choices
  under the fp32 policy; or as ``tl.dot`` on tensor cores with tf32 or bf16 operands (``"tf32"``
  / ``"bf16"``, under those policies). Dots pad the batch to 16 rows and need BLOCK_H >= 16.
* ``WAVE`` (a unidirectional stack of two or more layers only): the whole stack in one launch as a
  wavefront of L * P programs, each layer's P beside the others', so layer l takes step t while
  layer l + 1 takes step t - 1: T + L - 1 steps of the stack instead of L * T. Layers after the
  first compute their input projection in the kernel from the previous layer's h (read through
  L2 like h_{t-1}); with ``RESIDENT`` both the W_hh and the W_ih slice are held in registers
  (twice a layer kernel's), else both streamed. All L * P programs must be resident (at most the
  SM count). In the interpreter P is 1 and the L programs run in order.
* ``num_warps``.

Derived from those (fixed per config): ``BLOCK_B`` batch rows per inner step and ``BLOCK_K``
columns per chunk, so the product tile [BLOCK_B, BLOCK_H, BLOCK_K] holds at most 32 elements per
thread on the fma path; configs whose gate accumulators would take more than 64 registers per
thread are left out (they spill, and took a minute each to compile for sm_90).
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.space.axes import Axis, Space, next_pow2, pow2_range
from kernelwright.space.config import Config

NAME = "triton.rnn"
FMA_TILE_PER_THREAD = 32  # product-tile elements per thread on the fma path
RESIDENT_REGS_PER_THREAD = 128  # registers per thread a resident W_hh slice may take
ACCUMULATORS_PER_THREAD = 64  # gate accumulators ([BLOCK_B, BLOCK_H] per gate) per thread



@dataclass(frozen=True)
class RnnShape:
    """What the schedule of one recurrent node depends on."""

    hidden: int  # H
    batch: int  # B
    gates: int  # G: 4 (LSTM), 3 (GRU), 1 (tanh / relu RNN)
    directions: int  # D: 1 or 2
    layers: int = 1  # L

    @property
    def stacks(self) -> bool:
        """Whether the layers can run as one wavefront launch (unidirectional, two or more)."""
        return self.layers >= 2 and self.directions == 1


def programs(shape: RnnShape, block_h: int) -> int:
    """P, the programs of one direction: ceil(H / BLOCK_H)."""
    return -(-shape.hidden // block_h)


def derived(shape: RnnShape, block_h: int, resident: bool, dot: str, num_warps: int) -> dict:
    """BLOCK_B and BLOCK_K for the chosen axes (see the module docstring)."""
    hp = next_pow2(shape.hidden)
    bp = next_pow2(shape.batch)
    threads = 32 * num_warps
    if dot != "fma":
        # tensor-core tiles: [BLOCK_B >= 16, BLOCK_K >= 16] x [BLOCK_K, BLOCK_H >= 16]
        block_b = max(16, min(bp, 64))
        block_k = hp if resident else max(16, min(hp, 64))
        return {"BLOCK_B": block_b, "BLOCK_K": block_k}
    block_k = hp if resident else min(hp, 32)
    budget = FMA_TILE_PER_THREAD * threads
    block_b = max(1, min(bp, budget // (block_h * block_k)))
    return {"BLOCK_B": 1 << (block_b.bit_length() - 1), "BLOCK_K": block_k}


def _fits(shape: RnnShape, spec: DeviceSpec, interpreter: bool):
    hp = next_pow2(shape.hidden)

    def ok(c: dict) -> bool:
        p = programs(shape, c["BLOCK_H"])
        wave = c.get("WAVE", False)
        if interpreter and p != 1:
            return False
        if not interpreter and (spec.sms <= 0 or p * (shape.layers if wave else shape.directions) > spec.sms):
            return False
        if c["BLOCK_H"] > hp or (p > 1 and (p - 1) * c["BLOCK_H"] >= shape.hidden):
            return False
        threads = 32 * c["num_warps"]
        if c["DOT"] != "fma" and (c["BLOCK_H"] < 16 or hp < 16):
            return False
        if c["RESIDENT"]:
            elems = (2 if wave else 1) * shape.gates * c["BLOCK_H"] * hp  # (a wavefront's W_ih slice too)
            if elems > spec.regs_per_sm // 2 or elems // threads > RESIDENT_REGS_PER_THREAD:
                return False
            if c["DOT"] == "fma" and c["BLOCK_H"] * hp > FMA_TILE_PER_THREAD * threads * 4:
                return False  # one batch row's product tile [BLOCK_H, H] must stay small
        d = derived(shape, c["BLOCK_H"], c["RESIDENT"], c["DOT"], c["num_warps"])
        if (2 if wave else 1) * shape.gates * d["BLOCK_B"] * c["BLOCK_H"] > ACCUMULATORS_PER_THREAD * threads:
            return False  # the gates' accumulators (the input projection's too, in a wavefront) would spill
        if c["DOT"] == "fma":
            tile = d["BLOCK_B"] * c["BLOCK_H"] * d["BLOCK_K"]
            if tile > FMA_TILE_PER_THREAD * threads:
                return False
            if tile < threads // 2 and c["num_warps"] > 1:
                return False  # a tile too small for the warps
        return True

    return ok


def dot_modes(precision: str) -> list[str]:
    """The matvec implementations a policy allows, the preferred one last: IEEE float32 (a
    broadcast multiply and sum, or `tl.dot(input_precision="ieee")`) under every policy, tensor
    cores only under tf32 / bf16. Multiply-and-sum comes after the IEEE dot: on the H200 it was the
    faster fp32 matvec on both GRU sizes measured (docs/benchmarks.md, "Persistent RNN kernels")."""
    if precision == "tf32":
        return ["ieee", "fma", "tf32"]
    if precision == "bf16":
        return ["ieee", "fma", "bf16"]
    return ["ieee", "fma"]


def rnn_space(shape: RnnShape, *, spec: DeviceSpec | None = None, precision: str = "fp32",
              interpreter: bool = False) -> list[Config]:
    """Every admissible config for `shape` on `spec` (default `device_spec()`); `interpreter`:
    the Triton interpreter runs the kernel, so P = 1."""
    spec = spec or device_spec()
    hp = next_pow2(shape.hidden)
    axes = [Axis("DOT", dot_modes(precision)), Axis("RESIDENT", [False, True]),
            Axis("BLOCK_H", pow2_range(1, hp)), Axis("num_warps", [1, 2, 4, 8])]
    if shape.stacks:
        axes.append(Axis("WAVE", [False, True]))
    space = Space(NAME, axes, [_fits(shape, spec, interpreter)])
    return [c.replace(**derived(shape, c["BLOCK_H"], c["RESIDENT"], c["DOT"], c["num_warps"]))
            for c in space.configs()]


def _rank(shape: RnnShape, precision: str):
    """The default's order: the policy's preferred matvec, the smallest BLOCK_H, W_hh resident,
    4 warps (8 for a resident slice of more than 64 registers per thread at 4)."""
    modes = dot_modes(precision)

    def rank(c: Config):
        warps = 4
        if c["RESIDENT"] and shape.gates * c["BLOCK_H"] * next_pow2(shape.hidden) // (32 * 4) > 64:
            warps = 8
        return (c.get("WAVE", False), -modes.index(c["DOT"]), c["BLOCK_H"], not c["RESIDENT"], c["num_warps"] != warps,
                c["num_warps"])
    return rank


def rnn_default(shape: RnnShape, *, spec: DeviceSpec | None = None, precision: str = "fp32",
                interpreter: bool = False) -> Config:
    """The heuristic choice: tensor cores where the policy allows them, else multiply and sum;
    the smallest BLOCK_H (most programs, the most SMs streaming
    W_hh) that keeps D * P within the SM count; W_hh register-resident when it fits; 4 warps (8 for
    a resident slice of more than 64 registers per thread at 4). In the interpreter: one program
    per direction holding the whole hidden state."""
    configs = rnn_space(shape, spec=spec, precision=precision, interpreter=interpreter)
    if not configs:
        raise ValueError(f"no persistent-RNN config fits {shape} on {(spec or device_spec()).name}")
    return min(configs, key=_rank(shape, precision))


def rnn_seeds(shape: RnnShape, *, spec: DeviceSpec | None = None, precision: str = "fp32",
              interpreter: bool = False, count: int = 5) -> list[Config]:
    """The default first, then the best-ranked config of: each other matvec, the other W_hh
    residency, and BLOCK_H twice the default's (fewer programs, shorter barriers). Under tensor-core
    policies a stack's wavefront (WAVE) with streamed weights comes second: on the H100 it ran the
    6-layer lstm_cn in 6.5 ms against 16.8 for the best launch per layer, and lost on the 2-layer
    H = 1024 lstm (10.2 against 6.0), which the search then keeps (docs/benchmarks.md, "The
    layer-parallel wavefront"). Under fp32 it lost on both and is no seed."""
    configs = rnn_space(shape, spec=spec, precision=precision, interpreter=interpreter)
    rank = _rank(shape, precision)
    first = min(configs, key=rank) if configs else rnn_default(shape, spec=spec, precision=precision,
                                                               interpreter=interpreter)
    wants = [{"DOT": first["DOT"], "WAVE": True, "RESIDENT": False}] if first["DOT"] in ("tf32", "bf16") else []
    wants += [{"DOT": m} for m in reversed(dot_modes(precision)) if m != first["DOT"]]
    wants += [{"DOT": first["DOT"], "RESIDENT": not first["RESIDENT"]},
              {"DOT": first["DOT"], "BLOCK_H": first["BLOCK_H"] * 2}]
    out = [first]
    for want in wants:
        pick = [c for c in configs if all(c.get(k, False) == v for k, v in want.items()) and c not in out]
        if pick:
            out.append(min(pick, key=rank))
    return out[:count]


__all__ = ["NAME", "RnnShape", "derived", "dot_modes", "next_pow2", "programs", "rnn_default", "rnn_seeds",
           "rnn_space"]
