"""Capture: torch.export to an ATen-level graph with shapes, dtypes and strides on every node."""
from kernelwright.capture.graph import Graph, Input, OpNode, Ref, TensorMeta
from kernelwright.capture.export import CaptureError, capture

__all__ = ["Graph", "Input", "OpNode", "Ref", "TensorMeta", "CaptureError", "capture"]
