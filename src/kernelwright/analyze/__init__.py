"""Analyze: op class, FLOPs, minimum bytes, arithmetic intensity and roofline time of every node."""
from kernelwright.analyze.classify import CLASSES, POINTWISE_OPS, is_view, op_class, op_class_of
from kernelwright.analyze.cost import NodeCost, node_cost
from kernelwright.analyze.device import DEVICES, DeviceSpec, device_spec, load_ceilings
from kernelwright.analyze.roofline import Analysis, NodeRow, analyze
from kernelwright.analyze.render import render_class_summary, render_table

__all__ = [
    "CLASSES", "POINTWISE_OPS", "is_view", "op_class", "op_class_of", "NodeCost", "node_cost",
    "DEVICES", "DeviceSpec", "device_spec", "load_ceilings", "Analysis", "NodeRow", "analyze",
    "render_class_summary", "render_table",
]
