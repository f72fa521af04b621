"""Roofline analysis of a captured graph: per node and in total, on one device and precision.

A node's roofline time is max(FLOPs / peak, bytes / bandwidth): the least time any kernel
could take for it when it runs alone, reading its inputs from and writing its outputs to DRAM.
Tensor-core peaks (TF32, BF16) apply to GEMM and convolution nodes only; every other op runs at
the FP32 peak (it is memory-bound in practice anyway).

Totals give two floors for the whole program:
- `roofline_us`: the sum of the per-node times — every op as its own kernel (unfused);
- `fused_roofline_us`: max(all compute, graph inputs read once + outputs written once) — the
  floor if everything were fused into one kernel. A real plan lies between the two.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kernelwright.analyze.classify import CLASSES, is_view, op_class
from kernelwright.analyze.cost import consumers, min_bytes, node_cost
from kernelwright.analyze.device import DeviceSpec
from kernelwright.capture.graph import Graph

PRECISIONS = ("fp32", "tf32", "bf16")
TENSOR_CORE_CLASSES = frozenset({"gemm", "conv"})


@dataclass
class NodeRow:
    name: str
    op: str
    target: str
    cls: str
    shape: tuple[int, ...] | None
    dtype: str | None
    flops: int
    bytes: int
    read_bytes: int
    write_bytes: int
    intensity: float | None  # FLOPs per byte; None when the node moves no bytes but computes
    compute_us: float
    memory_us: float
    roofline_us: float
    bound: str  # "memory" | "compute"
    free: bool  # a view (or other node) with no FLOPs and no bytes

    def to_json(self) -> dict:
        return {
            "name": self.name, "op": self.op, "target": self.target, "class": self.cls,
            "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
            "flops": self.flops, "bytes": self.bytes, "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes, "intensity": self.intensity,
            "compute_us": self.compute_us, "memory_us": self.memory_us,
            "roofline_us": self.roofline_us, "bound": self.bound, "free": self.free,
        }


@dataclass
class Analysis:
    problem: str
    device: DeviceSpec
    precision: str
    nodes: list[NodeRow]
    totals: dict = field(default_factory=dict)

    def row(self, name: str) -> NodeRow:
        for r in self.nodes:
            if r.name == name:
                return r
        raise KeyError(name)

    def of_class(self, cls: str) -> list[NodeRow]:
        return [r for r in self.nodes if r.cls == cls]

    def to_json(self) -> dict:
        return {
            "problem": self.problem,
            "device": self.device.to_json(),
            "precision": self.precision,
            "nodes": [r.to_json() for r in self.nodes],
            "totals": self.totals,
        }


def _times(flops: int, nbytes: int, peak_tflops: float, bw_gbs: float) -> tuple[float, float]:
    compute = flops / (peak_tflops * 1e12) * 1e6 if peak_tflops > 0 else 0.0
    memory = nbytes / (bw_gbs * 1e9) * 1e6 if bw_gbs > 0 else 0.0
    return compute, memory


def analyze(graph: Graph, spec: DeviceSpec, precision: str = "fp32") -> Analysis:
    """Classify every node, count its FLOPs and minimum bytes, and place it on `spec`'s roofline."""
    if precision not in PRECISIONS:
        from kernelwright.errors import UserError

        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    users = consumers(graph)
    rows: list[NodeRow] = []
    for node in graph.nodes:
        cls = op_class(node)
        cost = node_cost(node, graph, users)
        peak = spec.peak_tflops(precision, cls in TENSOR_CORE_CLASSES)
        compute, memory = _times(cost.flops, cost.bytes, peak, spec.mem_bw_gbs)
        if cost.bytes:
            intensity = cost.flops / cost.bytes
        else:
            intensity = None if cost.flops else 0.0
        meta = node.meta
        rows.append(NodeRow(
            name=node.name, op=node.op, target=node.target, cls=cls,
            shape=meta.shape if meta else None, dtype=meta.dtype if meta else None,
            flops=cost.flops, bytes=cost.bytes, read_bytes=cost.read_bytes,
            write_bytes=cost.write_bytes, intensity=intensity, compute_us=compute,
            memory_us=memory, roofline_us=max(compute, memory),
            bound="compute" if compute > memory else "memory",
            free=(cost.flops == 0 and cost.bytes == 0) or is_view(node),
        ))
    return Analysis(graph.name, spec, precision, rows, _totals(graph, rows, spec, users))


def _share(part: dict[str, float], total: float) -> dict[str, float]:
    return {k: (v / total if total else 0.0) for k, v in part.items() if v}


def _totals(graph: Graph, rows: list[NodeRow], spec: DeviceSpec, users) -> dict:
    flops = sum(r.flops for r in rows)
    nbytes = sum(r.bytes for r in rows)
    compute = sum(r.compute_us for r in rows)
    memory = sum(r.memory_us for r in rows)
    roofline = sum(r.roofline_us for r in rows)
    count = {c: 0 for c in CLASSES}
    f_cls = {c: 0.0 for c in CLASSES}
    b_cls = {c: 0.0 for c in CLASSES}
    t_cls = {c: 0.0 for c in CLASSES}
    for r in rows:
        count[r.cls] += 1
        f_cls[r.cls] += r.flops
        b_cls[r.cls] += r.bytes
        t_cls[r.cls] += r.roofline_us
    # the fused floor: graph inputs read once, outputs (and mutated buffers) written once
    read_inputs = [i for i in graph.inputs if i.name in users or i.name in graph.outputs]
    io_read = sum(min_bytes(i.meta) for i in read_inputs)
    written = list(dict.fromkeys(list(graph.outputs) + list(graph.mutations)))
    io_write = 0
    for name in written:
        try:
            io_write += min_bytes(graph.meta(name))
        except KeyError:
            pass
    io_bytes = io_read + io_write
    io_us = io_bytes / (spec.mem_bw_gbs * 1e9) * 1e6 if spec.mem_bw_gbs > 0 else 0.0
    return {
        "nodes": len(rows),
        "free_nodes": sum(1 for r in rows if r.free),
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "compute_us": compute,
        "memory_us": memory,
        "roofline_us": roofline,
        "bound": "compute" if compute > memory else "memory",
        "io_bytes": io_bytes,
        "fused_roofline_us": max(compute, io_us),
        "fused_bound": "compute" if compute > io_us else "memory",
        "count": {c: n for c, n in count.items() if n},
        "flops_share": _share(f_cls, flops),
        "bytes_share": _share(b_cls, nbytes),
        "time_share": _share(t_cls, roofline),
    }
