"""Tuners: build, verify and time the candidates of one unit of a plan (a `run` for `tune`).

A unit is a fusion group (GroupTuner), a library node with a node template (NodeTuner), a
library GEMM with its epilogue group (GemmTuner), a convolution, alone or with its epilogue
group (ConvTuner), or a pool with its pointwise neighbours (PoolChainTuner). Failures are results, never exceptions.
"""
from __future__ import annotations

import dataclasses

import math
from pathlib import Path
from typing import Callable

import torch

from kernelwright.analyze.device import DeviceSpec, device_spec
from kernelwright.build.compile_ahead import compile_ahead
from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture.execute import input_device, run_node
from kernelwright.capture.shapes import channels_last_strides
from kernelwright.codegen import conv_epilogue, cudnn_epilogue, gemm_epilogue, library_epilogue, node_kernels, pool_chain
from kernelwright.codegen.triton_pool import TEMPLATE as POOL_TEMPLATE
from kernelwright.codegen.helpers import launch_out_params
from kernelwright.codegen.node_kernels import used_outputs
from kernelwright.codegen.slice_copy import copy_into
from kernelwright.codegen.triton_group import (Unsupported, extent, inner_rows, lower, render_group, tiled_apply_dims,
                                              transposed_walk)
from kernelwright.measure import watchdog
from kernelwright.plan.concat import placed_slot
from kernelwright.policy import Policy
from kernelwright.search.result import RunResult
from kernelwright.space.config import Config
from kernelwright.space.conv_space import conv_space
from kernelwright.space.gemm_space import gemm_space, rowreduce_space
from kernelwright.space.group_space import (default_config, group_space, row_warps, seed_configs, strided_long_rows,
                                            tiled_default, tiled_space)
from kernelwright.verify.compare import excess_reason, park, poisoned_like


def _floating(v):
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _time_fns(fns: dict[str, Callable], device) -> dict[str, float]:
    """Median device time (ms) of each candidate or library path: the search's short protocol, the
    host's launch overhead hidden (measure.timer `device_only`)."""
    from kernelwright.measure.timer import time_interleaved

    t = time_interleaved(fns, warmup_s=0.05, min_runs=20, max_runs=60, flush=True, device=device, device_only=True)
    return {k: v.median_ms for k, v in t.items()}


def kernel_resources(mod) -> dict:
    """Registers, spills and shared memory of the compiled Triton kernel, when the GPU compiled one."""
    for obj in vars(mod).values():
        cache = getattr(obj, "device_caches", None) or getattr(obj, "cache", None)
        if not cache:
            continue
        try:
            for dev_cache in (cache.values() if isinstance(cache, dict) else []):
                kernels = dev_cache[0] if isinstance(dev_cache, tuple) else dev_cache
                for k in kernels.values():
                    return {"registers": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None),
                            "shared_bytes": getattr(getattr(k, "metadata", None), "shared", None)}
        except Exception:  # noqa: BLE001 - best effort, Triton internals vary
            return {}
    return {}


class KernelTuner:
    """Builds, verifies and times the candidates of one unit (a `run` function for search.tune).

    Subclasses say how a config becomes module text (`render`). Verification compares every
    output the unit produces with a float64 run of the unit's ATen ops on the same inputs;
    outputs are NaN-poisoned first, so elements a kernel never writes fail."""

    name = "unit"
    backend = "triton"  # what a chosen candidate is: a generated "triton" kernel or a "torch" layout variant

    def __init__(self, graph, nodes: list[str], inputs: list[str], outputs: list[tuple[str, int | None]],
                 env, policy: Policy, device: torch.device, cache_dir: Path, timed: bool):
        self.graph, self.nodes, self.unit_inputs, self.outputs = graph, nodes, inputs, outputs
        self.env, self.policy, self.device, self.cache_dir, self.timed = env, policy, device, cache_dir, timed
        ref = self._run_library(torch.float64)
        self.ref64 = [park(_pick(ref, o)) for o in outputs]  # (a large one rounded to float32 or in host memory: compare.park)
        del ref
        self.eager = [_pick(env, o) for o in outputs]
        self.eager_excess = max((excess_reason(e, r, policy.tol, e.dtype)[0] for e, r in zip(self.eager, self.ref64)),
                                default=-math.inf)
        self.threshold = max(policy.tol, 4 * self.eager_excess)
        self.modules: dict[str, object] = {}
        self.library_ms: float | None = None
        # called with (config, message) before the process ends when a candidate's first run
        # hangs on the GPU (measure/watchdog.py); None: no guard
        self.on_hang: Callable[[Config, str], None] | None = None
        self.hang_s: float | None = None  # None: watchdog.limit_seconds()

    def _run_library(self, dtype=None) -> dict:
        """The unit's ATen ops on its inputs (in `dtype`, for the high-precision reference: then a
        value no later op reads is let go as soon as it is read, so the float64 run holds about
        what eager holds, not every intermediate)."""
        local = {k: (self.env[k].to(dtype) if dtype is not None and _floating(self.env[k]) else self.env[k])
                 for k in self.unit_inputs}
        dev = input_device(local) or self.device
        last = {v: i for i, name in enumerate(self.nodes) for v in self.graph.node(name).inputs}
        kept = {name for name, _ in self.outputs}
        for i, name in enumerate(self.nodes):
            node = self.graph.node(name)
            if dtype is not None and node.target == "aten._to_copy.default" \
                    and isinstance(node.kwargs.get("dtype"), torch.dtype) and node.kwargs["dtype"].is_floating_point:
                # the high-precision reference keeps its dtype through the policy's casts (bf16 operands)
                node = dataclasses.replace(node, kwargs={**node.kwargs, "dtype": dtype})
            local[name] = run_node(node, local, dev)
            if dtype is not None:
                for v in [v for v, j in last.items() if j == i and v not in kept]:
                    local.pop(v, None)
        return local

    def library_fn(self):
        return self._run_library

    def _placed_after(self, run: Callable, values: Callable) -> Callable:
        """`run` timed as the emitted forward pays for it: where an output lies in a concatenation's
        buffer (plan.concat) and `run` cannot write it there, the copy into that slice after it
        (`values(result)`: the outputs in self.outputs' order). `run` itself when none."""
        placed = [(k, self.graph.meta(name)) for k, (name, idx) in enumerate(self.outputs)
                  if idx is None and placed_slot(self.graph, name) is not None]
        if not placed:
            return run
        dst = [(k, _compact_like(m.shape, m.stride, self.eager[k])) for k, m in placed]

        def copied():
            out = run()
            got = values(out)
            for k, d in dst:
                copy_into(d, got[k])
            return out

        return copied

    def render(self, cfg: Config) -> tuple[str, list[str]]:
        """(module text, graph values passed to launch) for `cfg`."""
        raise NotImplementedError

    def pick(self, outs) -> list:
        """The launch() results in the order of self.outputs."""
        return list(outs)

    def build(self, cfg: Config):
        text, ins = self.render(cfg)
        mod = load_module_from_source(text, self.name, self.cache_dir)
        self.modules[cfg.key()] = mod
        return text, ins, mod

    def check(self, ins, mod) -> float:
        """Run once with NaN-poisoned outputs; returns the excess, raising ValueError on failure."""
        args = [self.env[v] for v in ins]
        real_alloc = getattr(mod, "_alloc", None)  # absent in modules whose library calls allocate
        if real_alloc is not None:
            mod._alloc = lambda shape, dtype, device, stride=None: poisoned_like(real_alloc(shape, dtype, device, stride))
        try:
            with self.policy.active():
                outs = self.pick(mod.launch(*args))
        finally:
            if real_alloc is not None:
                mod._alloc = real_alloc
        worst = -math.inf
        for (name, _), out, ref, eager in zip(self.outputs, outs, self.ref64, self.eager):
            ex, why = excess_reason(out, ref, self.policy.tol, eager.dtype)
            if why or ex > self.threshold:
                raise ValueError(f"wrong: {name} excess {ex:.3g} > {self.threshold:.3g}" + (f" ({why})" if why else ""))
            worst = max(worst, ex)
        return worst

    def _hang_limit(self) -> float:
        return watchdog.limit_seconds() if self.hang_s is None else self.hang_s

    def _hung(self, cfg: Config) -> None:
        msg = (f"candidate {cfg.key()} of unit {self.name} did not finish its first run (compile and "
               f"verification) within {self._hang_limit():.0f} s on the GPU")
        watchdog.hang_exit(msg, lambda m: self.on_hang(cfg, m))

    def run(self, configs: list[Config]) -> list[RunResult]:
        results, fns, built, staged, writes_in_place = [], {}, {}, [], {}
        for cfg in configs:
            try:
                text, ins, mod = self.build(cfg)
            except Exception as e:  # noqa: BLE001 - failures are data (Unsupported included)
                results.append(RunResult.failure(cfg, "compile", f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            staged.append((cfg, ins, mod))
            writes_in_place[cfg.key()] = bool(launch_out_params(text))
        if self.timed and self.backend == "triton" and len(staged) > 1 and torch.device(self.device).type == "cuda":
            # the batch's Triton kernels compiled side by side first (each first run below then
            # finds its kernels compiled; what did not compile in time compiles there, guarded)
            try:
                with self.policy.active():
                    compile_ahead([(mod, [self.env[v] for v in ins]) for _, ins, mod in staged],
                                  limit_s=self._hang_limit())
            except Exception:  # noqa: BLE001 - an optional pass: the first runs below compile what it did not
                pass
        for cfg, ins, mod in staged:
            try:
                with watchdog.guard(self._hang_limit() if (self.timed and self.on_hang) else None,
                                    lambda c=cfg: self._hung(c)):
                    ex = self.check(ins, mod)
            except ValueError as e:
                results.append(RunResult.failure(cfg, "wrong", str(e)))
                continue
            except Exception as e:  # noqa: BLE001
                first = (str(e).splitlines() or [''])[0][:200]
                if self.timed and self.on_hang and watchdog.is_device_fault(e):
                    msg = f"candidate {cfg.key()} of unit {self.name} faulted the GPU ({first})"
                    watchdog.hang_exit(msg, lambda m, c=cfg: self.on_hang(c, m, watchdog.FAULT))
                results.append(RunResult.failure(cfg, "crash", f"{type(e).__name__}: {first}"))
                continue
            args = [self.env[v] for v in ins]
            built[cfg.key()] = (cfg, ex)
            run = (lambda m=mod, a=args: m.launch(*a))
            fns[cfg.key()] = run if writes_in_place[cfg.key()] else self._placed_after(run, self.pick)
        if not self.timed:
            return results + [RunResult(cfg, None, "untimed: no GPU", excess=ex) for cfg, ex in built.values()]
        if fns:
            with self.policy.active():
                library = self._placed_after(self.library_fn(), lambda env: [_pick(env, o) for o in self.outputs])
                times = _time_fns({**fns, "__library__": library}, self.device)
            lib_ms = times.pop("__library__")
            self.library_ms = lib_ms if self.library_ms is None else min(self.library_ms, lib_ms)
            for key, (cfg, ex) in built.items():
                results.append(RunResult(cfg, times[key], None, excess=ex))
        return results


def _compact_like(shape, stride, like: torch.Tensor) -> torch.Tensor:
    """An empty tensor of `shape` whose dims lie in memory in the order of `stride`'s (a slice of a
    concatenation's NCHW buffer: contiguous; of a channels-last one: channels-last), packed: a copy
    into it moves what a copy into the slice moves, without allocating the rest of the buffer."""
    order = sorted(range(len(shape)), key=lambda i: (-stride[i], i))
    return torch.empty_permuted(shape, order, dtype=like.dtype, device=like.device)


def _pick(env: dict, out: tuple[str, int | None]):
    name, idx = out
    return env[name] if idx is None else env[name][idx]


class GroupTuner(KernelTuner):
    """A fusion group rendered by codegen/triton_group.py."""

    def __init__(self, graph, group, env, policy, device, cache_dir, timed):
        self.group = group
        self.low = lower(graph, group)
        self.name = group.id
        super().__init__(graph, group.nodes, group.inputs, [(o, None) for o in group.outputs], env, policy,
                         device, cache_dir, timed)
        self.M, self.R, self.r_contig = extent(self.low)
        pw = group.rdims is None
        spec = device_spec()
        self.space = group_space(self.M, self.R, pw, self.r_contig, spec=spec)
        self.seeds = seed_configs(self.M, self.R, pw, self.r_contig, spec=spec)
        self.default = default_config(self.M, self.R, pw, self.r_contig, spec=spec)
        if pw and transposed_walk(self.low) is not None:  # e.g. channels-last in, NCHW out: tiles only
            # (flat pointwise schedules read or write across the layout change: 4-6x slower on every
            # such group measured on the H200, yet the model kept proposing them)
            self.space = tiled_space()
            self.default = tiled_default()
            # then the fastest tiles measured on the H200: 16 x 128 (bf16 in), 32 x 128 and 64 x 64 (fp32 in)
            self.seeds = [self.default, self.default.replace(BLOCK_Q=16, BLOCK_P=128),
                          self.default.replace(BLOCK_Q=32, BLOCK_P=128),
                          self.default.replace(BLOCK_Q=64, BLOCK_P=64, num_warps=8)]
        elif not pw and strided_long_rows(self.M, self.R, self.r_contig, spec=spec) and tiled_apply_dims(self.low):
            # e.g. a group norm over channels-last data returned NCHW: split statistics, then an
            # apply pass over [BLOCK_Q pixels, channels of BLOCK_M groups] tiles (coalesced both ways)
            tiled = [c.replace(TILED_APPLY=True) for c in self.space
                     if c.template == "triton.split" and c["BLOCK_M"] <= 16]
            # the apply tile's height, set apart from the partial pass's BLOCK_R (a taller one
            # writes longer runs of the NCHW output)
            tall = [c.replace(APPLY_Q=q) for c in tiled for q in (32, 64) if c["BLOCK_M"] >= 8]
            self.space = tiled + tall + self.space
            first = [c for c in tiled if c["BLOCK_M"] == 1 and c["BLOCK_R"] == 2048 and c["num_warps"] == 8]
            # 8 or 16 groups side by side: 64-channel (256-byte) rows for 8-channel groups; the
            # 8 x 512 tile also writes 64-pixel (128-byte) runs of a bf16 output, as the 16 x 128
            # one does with a 64-pixel apply tile
            order = [(16, 128, 64), (8, 256, 64), (8, 256, None), (16, 128, None), (8, 512, None)]
            wide = sorted((c for c in tiled + tall if (c["BLOCK_M"], c["BLOCK_R"], c.get("APPLY_Q")) in order
                           and c["SPLIT"] == 256 and c["num_warps"] == 8),
                          key=lambda c: order.index((c["BLOCK_M"], c["BLOCK_R"], c.get("APPLY_Q"))))
            self.seeds = first[:1] + wide + first[-1:] + self.seeds
        elif not pw and self.seeds[0].template == "triton.row" and inner_rows(self.low) is not None:
            # a row group written with the output's contiguous dim across the rows (a softmax over
            # a channels-last tensor's channels, returned NCHW): rows walked along that dim store
            # runs of it: at least 32 rows of them first, then the row schedule as it is, then 64
            rows = [c for c in self.space if c.template == "triton.row" and c["BLOCK_M"] >= 16]
            self.space = self.space + [c.replace(INNER=True) for c in rows]
            base = self.seeds[0]
            tall = [max(32, base["BLOCK_M"]), max(64, 2 * base["BLOCK_M"])]
            lead = [base.replace(INNER=True, BLOCK_M=bm, num_warps=row_warps(bm * base["BLOCK_R"])) for bm in tall]
            lead = [c for c in lead if c in self.space]
            self.seeds = lead[:1] + [base] + lead[1:] + self.seeds[1:]
        if group.normalizes:  # split schedules' apply pass, also walked last tile first (L2 reuse)
            splits = [c for c in self.space if c.template == "triton.split"]
            self.space = self.space + [c.replace(APPLY_REVERSE=True) for c in splits]
            lead = [c for c in self.seeds if c.template == "triton.split"][:2]
            if lead:
                at = self.seeds.index(lead[-1]) + 1
                self.seeds = self.seeds[:at] + [c.replace(APPLY_REVERSE=True) for c in lead] + self.seeds[at:]
        self.features = {"log2_M": math.log2(max(self.M, 1)), "log2_R": math.log2(max(self.R, 1)),
                         "log2_bytes": math.log2(max(1, sum(graph.meta(v).nbytes for v in group.inputs))),
                         "n_nodes": len(group.nodes), "n_reduce": sum(1 for s in self.low.stmts if s.kind == "reduce"),
                         "kind": group.kind}
        self.task = f"{'x'.join(map(str, group.domain))}/{group.kind}/{'+'.join(graph.node(n).op for n in group.nodes)}"

    def render(self, cfg):
        k = render_group(self.graph, self.group, cfg.as_dict(), self.low)
        return k.source, k.inputs


class NodeTuner(KernelTuner):
    """A single library node with a node template (pooling, scans). A template that also computes
    neighbouring nodes (``absorbed``) is timed against what the program would otherwise run for
    them: `impls` (env -> env functions, from `unit_impl`: the units' chosen implementations one
    after the other); without them, against their ATen ops."""

    def __init__(self, graph, node, template, env, policy, device, cache_dir, timed, impls=None):
        self.node, self.template, self.impls = node, template, impls
        self.used = used_outputs(graph, node)
        self.name = node.name
        pattern = node_kernels.absorbed(template, graph, node)
        if pattern is not None:  # e.g. flip -> cumsum -> flip: one kernel from x to the last value
            nodes, x, last = pattern  # x: the value the kernel reads, or a list of them
            self.absorbs, self.result = [n for n in nodes if n != node.name], last
            super().__init__(graph, nodes, [x] if isinstance(x, str) else list(x), [(last, None)], env, policy,
                             device, cache_dir, timed)
        else:
            self.absorbs, self.result = [], node.name
            multi = len(node.outs) > 1
            outs = [(node.name, i) for i in sorted(self.used)] if multi else [(node.name, None)]
            super().__init__(graph, [node.name], node.inputs, outs, env, policy, device, cache_dir, timed)
        self.backend = template.name.split(".")[0]
        spec = device_spec()
        by_policy = node_kernels.policy_kwargs(template, policy.name)  # e.g. tensor-core matvecs under tf32 only
        self.space = template.space(graph, node, spec, **by_policy)
        self.default = template.default(graph, node, spec, **by_policy)
        self.seeds = node_kernels.seeds(template, graph, node, spec, policy.name)
        meta = graph.meta(node.inputs[0]) if node.inputs else None
        self.features = {"log2_bytes": math.log2(max(1, meta.nbytes if meta else 1)), "kind": template.name}
        self.task = f"{node.target}/{'x'.join(map(str, meta.shape)) if meta else ''}"

    def library_fn(self):
        return self._run_library if self.impls is None else chained(self.env, self.unit_inputs, self.impls)

    def render(self, cfg):
        k = self.template.render(self.graph, self.node, cfg.as_dict(), self.used)
        return k.source, k.inputs

    def pick(self, outs):
        return [outs[i if i is not None else 0] for _, i in self.outputs]


def fused_gemm_space(graph, f: gemm_epilogue.GemmEpilogue, policy: str,
                     spec: DeviceSpec | None = None) -> list[Config]:
    """The Triton configs searched for a fused GEMM (`f`) on the device `spec` (default
    `device_spec()`), expert order first: the row-reduction template's when the epilogue ends in
    one (with TMA variants when both operands are K-major), else the GEMM template's (TMA first
    when both operands are K-major, a persistent variant last where there are tiles enough and no
    operand is cast in the kernel; under tf32 a K-major copy of a row-major B)."""
    bf16_tensors = graph.meta(f.a).dtype == "bfloat16" and graph.meta(f.b).dtype == "bfloat16"
    precision, elem_bytes = ("bf16" if f.cast_bf16 else policy), 2 if bf16_tensors else 4
    k_major = f.k_major(graph)
    if f.reduce:  # the row reduction folded into the GEMM: the product is never written
        return [Config.make("triton.gemm_rowreduce", **c) for c in
                rowreduce_space(precision, M=f.M, N=f.N, K=f.K, elem_bytes=elem_bytes, reduce=f.reduce,
                                max_configs=40, tma=k_major, spec=spec)]
    # no persistent kernels where a float32 operand is rounded to bf16 in the kernel: on the H200
    # (Triton 3.6) 2 of 7 such configs returned NaN, both tried with a bias + ReLU epilogue inf, and the
    # best ran 0.476 ms against 0.43 for a cast kernel + cuBLAS (8192 x 4096 x 4096; docs/benchmarks.md,
    # "Design choices": persistent GEMM kernels)
    return [Config.make("triton.gemm", **c) for c in
            gemm_space(precision, M=f.M, N=f.N, K=f.K, elem_bytes=elem_bytes, max_configs=40, tma=k_major,
                       kmajor_copy=not k_major and policy == "tf32" and not f.cast_bf16,
                       persistent=not (f.cast_bf16 and not bf16_tensors), spec=spec)]


class GemmTuner(KernelTuner):
    """A library GEMM node and its epilogue group (and, under bf16, the operand-cast groups it
    absorbs) as one Triton GEMM (codegen/gemm_epilogue.py; a reduction over rows, or segments of
    rows, that fit one tile is folded into the GEMM), or, when the group is a bias + ReLU, as one
    cuBLASLt call with that epilogue (codegen/library_epilogue.py).

    The reference to beat is what the program would otherwise run: the absorbed casts' and the
    epilogue group's chosen implementations around the library GEMM (`impls`: group id -> env ->
    env, from `group_impl`)."""

    def __init__(self, graph, fused: gemm_epilogue.GemmEpilogue, impls, env, policy, device, cache_dir, timed):
        self.fused = f = fused
        gemm, group = f.gemm, f.group
        self.name = f"{group.id}_gemm"
        self.impls = impls
        casts = [n for g in f.prologue for n in g.nodes]
        absorbed = set(casts)
        ins = [v for v in dict.fromkeys([f.a, f.b] + gemm.inputs + group.inputs)
               if v != gemm.name and v not in absorbed]
        super().__init__(graph, casts + [gemm.name] + group.nodes, ins, [(group.outputs[0], None)],
                         env, policy, device, cache_dir, timed)
        self.space = fused_gemm_space(graph, f, policy.name, device_spec())
        self.seeds = self.space[:4]
        self.default = self.space[0]
        # cuBLASLt's own bias + ReLU epilogue, when the group is just that: one more candidate
        self.chain = "a row reduction" if f.reduce else library_epilogue.match(graph, gemm, group.nodes,
                                                                                group.outputs, f.N)
        if not isinstance(self.chain, str):
            lt = library_epilogue.config()
            self.space, self.seeds = [lt] + self.space, [lt] + self.seeds
        self.features = {"log2_M": math.log2(f.M), "log2_N": math.log2(f.N), "log2_K": math.log2(f.K),
                         "n_operands": len(f.operands), "kind": "gemm_rowreduce" if f.reduce else "gemm_epilogue",
                         "cast_operands": len(f.prologue)}
        self.task = f"gemm/{f.M}x{f.N}x{f.K}/{group.id}" + (f"/casts{len(f.prologue)}" if f.prologue else "") \
            + (f"/{f.reduce}" if f.reduce else "")

    def library_fn(self):
        gemm, env, dev, f = self.fused.gemm, self.env, self.device, self.fused
        before = [self.impls[g.id] for g in f.prologue]
        after = self.impls[f.group.id]
        ins = self.unit_inputs  # the GEMM's and the epilogue's (e.g. a bias split off an addmm)

        def run():
            local = {k: env[k] for k in ins}
            for impl in before:
                local = impl(local)
            local[gemm.name] = run_node(gemm, local, dev)
            return after(local)

        return run

    def render(self, cfg):
        if cfg.template == library_epilogue.NAME:
            return library_epilogue.render(self.graph, self.fused.gemm, self.chain, self.fused.a, self.fused.b,
                                           f"{self.fused.group.id}_gemm")
        return gemm_epilogue.render(self.fused, cfg.as_dict(), self.policy.name)


def group_impl(graph, group, kernel, cache_dir, source, device):
    """The group's chosen implementation as env -> env (kernel if one was chosen, else ATen)."""
    return unit_impl(graph, group.nodes, kernel, cache_dir, source, device, group.id)


class CudaTuner(KernelTuner):
    """A group that is one row operation, as a CUDA C++ kernel (codegen/cuda_unit.py).

    Needs a GPU (the kernels are compiled by NVRTC and launched through cuda.core)."""

    backend = "cuda"

    def __init__(self, graph, group, row, env, policy, device, cache_dir, timed):
        from kernelwright.codegen import cuda_unit
        from kernelwright.codegen.cuda_kernels import write_runtime

        self.group, self.row, self._unit = group, row, cuda_unit
        self.name = f"{group.id}_cuda"
        super().__init__(graph, group.nodes, group.inputs, [(o, None) for o in group.outputs], env, policy,
                         device, cache_dir, timed)
        write_runtime(cache_dir)  # the generated modules load kw_cuda_runtime.py from their folder
        self.space = cuda_unit.space(row)
        self.default = cuda_unit.default(row)
        self.seeds = [self.default] + [c for c in self.space if c != self.default][:3]
        self.features = {"log2_M": math.log2(max(row.M, 1)), "log2_N": math.log2(max(row.N, 1)), "kind": row.kind}
        self.task = f"{row.kind}/{row.op}/{row.M}x{row.N}"

    def render(self, cfg):
        return self._unit.render(self.graph, self.group, self.row, cfg.as_dict())


class ConvTuner(KernelTuner):
    """A convolution node alone (its bias fused), or with its pointwise epilogue group, as one
    implicit-GEMM Triton convolution (codegen/conv_epilogue.py); the input's layout copy or bf16
    cast that only the convolution reads is absorbed, and so is a pointwise group computing its
    input (the kernel's prologue).

    The reference to beat is what the program would otherwise run: the chosen implementations of
    the absorbed units, the convolution and the epilogue group, one after the other (`impls`:
    env -> env functions in that order, from `unit_impl`; None: the ATen ops of the nodes)."""

    def __init__(self, graph, fused: conv_epilogue.ConvEpilogue, impls, env, policy, device, cache_dir, timed,
                 spec: DeviceSpec | None = None):
        self.fused = f = fused
        last = f.post or (f.pools[-1] if f.pools else None) or f.group
        self.name = f"{getattr(last, 'id', last)}_conv" if last is not None else f"{f.conv.name}_conv"
        self.impls = impls
        stages = [s for s in (f.group, f.post) if s is not None]
        nodes = (list(f.absorbed_nodes) + [f.conv.name] + (list(f.group.nodes) if f.group is not None else [])
                 + list(f.pools) + (list(f.post.nodes) if f.post is not None else []))
        inner = set(nodes)
        ins = [v for v in dict.fromkeys([f.x, f.w] + f.conv.inputs + [v for s in stages for v in s.inputs]
                                        + list(f.prologue_operands)) if v not in inner]
        super().__init__(graph, nodes, ins, [(v, None) for v in f.outputs], env, policy, device, cache_dir, timed)
        self.absorbs, self.result = list(f.absorbed_nodes), f.out
        M, N, K = f.gemm
        groups = int(f.conv.args[8])
        bf16 = f.cast_bf16 or graph.meta(f.w).dtype == "bfloat16"
        precision = "bf16" if bf16 else policy.name
        cin = f.weight_shape[0] // groups if f.transposed else f.weight_shape[1]
        box_out = f.box_out(graph, precision)
        xm = graph.meta(f.x)
        # (launch copies an NCHW input channels-last for the box configs, in bf16 under CAST_BF16
        # where no input prologue computes on its float32 values)
        box_bytes = 2 if (f.cast_bf16 and f.prologue.empty
                          and tuple(xm.stride) != channels_last_strides(xm.shape)) else None
        self.space = [Config.make("triton.conv", **c) for c in
                      conv_space(M=M, N=N, K=K, precision=precision, elem_bytes=xm.itemsize, box_elem_bytes=box_bytes,
                                 spec=spec or device_spec(),
                                 # (an input pooled as it loads takes K steps of at most its channels: no folded taps)
                                 channels=1 << (cin.bit_length() - 1) if f.in_pool and cin >= 16 else cin, groups=groups,
                                 min_block_m=2 << (math.prod(f.pool_window) - 1).bit_length() if f.pool else 1, whole_n=f.whole_n,
                                 box_out=box_out, box_window=f.box_window)]
        if not f.prologue.empty:  # (an input prologue reads a box whole: no two-row boxes)
            self.space = [c for c in self.space if not c.as_dict().get("TWO_ROWS")]
        if f.norm is not None:  # (a tile of rows, not a box, may span two images at most: narrower tiles)
            least = math.prod(max(1, o // s) for o, s in zip(f.out_shape[2:], f.args["stride"])) if f.transposed \
                else math.prod(f.out_shape[2:])  # (an image's pixels in its smallest phase class)
            fit = 1 << (least.bit_length() - 1)
            self.space = list(dict.fromkeys(
                c if c.as_dict().get("BOX_W") or c.as_dict()["BLOCK_M"] <= fit else
                Config.make(c.template, **{**c.as_dict(), "BLOCK_M": fit}) for c in self.space
                if c.as_dict().get("BOX_W") or fit >= 16))
        # a depthwise convolution's direct kernel: its configs first, two of them the first seeds,
        # before the implicit GEMM's
        direct = [] if conv_epilogue.direct_depthwise(f) else \
            conv_epilogue.direct_space(f, tuple(xm.stride) == channels_last_strides(xm.shape))
        self.seeds = conv_epilogue.direct_seeds(direct) + self.space[:2] if direct else self.space[:4]
        self.space = direct + self.space
        if not self.space:
            raise Unsupported(f"no tile holds all {N} channels the epilogue reduces over" if f.norm is None else
                              "no tile of at most one image's pixels")
        self.default = self.space[0]
        # cuDNN's own bias (+ residual) + ReLU epilogue, when the group is just that (batch norm folded):
        # one more candidate, first, on a GPU
        split = None if f.norm is None else "sum" if f.norm.sums else "norm"
        if f.group is None or f.pool:
            self.chain = "no group"
        elif split is not None:
            self.chain = "a sum over the pixels" if split == "sum" else "a split norm"
        else:
            self.chain = cudnn_epilogue.match(graph, f.conv, f.group.nodes, f.group.outputs)
        if not isinstance(self.chain, str) and timed and torch.device(device).type == "cuda":
            lib = cudnn_epilogue.config()
            self.space, self.seeds = [lib] + self.space, [lib] + self.seeds
        self.features = {"log2_M": math.log2(max(M, 1)), "log2_N": math.log2(max(N, 1)), "log2_K": math.log2(max(K, 1)),
                         "log2_groups": math.log2(groups), "n_operands": len(f.operands),
                         "transposed": float(f.transposed), "spatial": len(f.out_shape) - 2,
                         "kind": "conv_pool" if f.pool else f"conv_{split}" if split
                         else "conv_epilogue" if f.group is not None else "conv",
                         "pool_window": float(math.prod(f.pool_window)) if f.pool else 1.0,
                         "box": box_out is not None, "prologue": float(not f.prologue.empty)}
        self.task = (f"conv{len(f.out_shape) - 2}d{'T' if f.transposed else ''}/{M}x{N}x{K}/g{groups}"
                     + (f"/{f.group.id}" if f.group is not None else "")
                     + (f"/{f.pool}{list(f.pool_window)}" + (f"/{f.post.id}" if f.post else "") if f.pool else "")
                     + ("/prologue" if not f.prologue.empty else "") + {"sum": "/sums", "norm": "/norm_stats", None: ""}[split])

    def library_fn(self):
        return self._run_library if self.impls is None else chained(self.env, self.unit_inputs, self.impls)

    def render(self, cfg):
        if cfg.template == cudnn_epilogue.NAME:
            return cudnn_epilogue.render(self.graph, self.fused.conv, self.chain, self.fused.x, self.name)
        if cfg.template == conv_epilogue.DIRECT:
            return conv_epilogue.render_direct(self.fused, cfg.as_dict(), self.name)
        return conv_epilogue.render(self.fused, cfg.as_dict(), self.policy.name, self.name)


class PoolChainTuner(KernelTuner):
    """A pooling node with the pointwise group computing its input and/or the one reading its
    result (plan.PoolChain) as one pool kernel (codegen/pool_chain.py). The reference to beat is
    what the program would otherwise run: the chain's units' chosen implementations one after the
    other (`impls`: env -> env functions, from `unit_impl`)."""

    def __init__(self, graph, kernel: pool_chain.ChainKernel, impls, env, policy, device, cache_dir, timed,
                 spec: DeviceSpec | None = None):
        self.kernel, self.impls = kernel, impls
        chain = kernel.chain
        self.name = f"{chain.post.id if chain.post else chain.pool}_chain"
        super().__init__(graph, kernel.nodes, kernel.inputs, [(chain.out, None)], env, policy, device, cache_dir,
                         timed)
        pool = graph.node(chain.pool)
        spec = spec or device_spec()
        self.space = POOL_TEMPLATE.space(graph, pool, spec)
        self.default = POOL_TEMPLATE.default(graph, pool, spec)
        self.seeds = [self.default] + [c for c in self.space if c != self.default
                                       and c["num_warps"] == self.default["num_warps"]][:3]
        meta = graph.meta(pool.inputs[0])
        self.features = {"log2_bytes": math.log2(max(1, meta.nbytes)), "kind": "pool_chain",
                         "n_operands": len(kernel.inputs)}
        self.task = (f"{pool.target}/{'x'.join(map(str, meta.shape))}/chain"
                     + (f"/{chain.pre.id}" if chain.pre else "") + (f"/{chain.post.id}" if chain.post else ""))

    def library_fn(self):
        return chained(self.env, self.unit_inputs, self.impls)

    def render(self, cfg):
        return pool_chain.render(self.kernel, cfg.as_dict(), self.name)


def chained(env: dict, inputs: list[str], impls) -> Callable[[], dict]:
    """A call running `impls` (env -> env functions) one after the other on `inputs` from `env`."""

    def run():
        local = {k: env[k] for k in inputs}
        for impl in impls:
            local = impl(local)
        return local

    return run


def unit_impl(graph, nodes: list[str], kernel, cache_dir, source, device, name: str):
    """A unit's chosen implementation as env -> env: its kernel (`kernel`: a plan_search.Chosen,
    `source` its module text) if one was chosen, else the ATen ops of `nodes`."""
    if kernel is not None and source is not None:
        mod = load_module_from_source(source, name, cache_dir)
        ins, outs, unpack = kernel[1], kernel[2], kernel[3]

        def run_kernel(local):
            res = mod.launch(*[local[v] for v in ins])
            if unpack:  # launch returned the node's whole tuple (a pool's values and indices)
                local[outs[0]] = tuple(res)
            else:
                local.update(zip(outs, res))
            return local

        return run_kernel
    aten = [graph.node(n) for n in nodes]

    def run_aten(local):
        for n in aten:
            local[n.name] = run_node(n, local, device)
        return local

    return run_aten
