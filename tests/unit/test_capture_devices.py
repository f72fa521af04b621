"""capture.export.capture: where the meta-device trace fails, the device it traces on instead."""
import types

import pytest
import torch
from torch import nn

from kernelwright.capture import export
from kernelwright.capture.export import CaptureError

from kernelwright.problem import from_module


class PlainAttribute(nn.Module):
    """A forward reading a tensor held as a plain attribute (not a buffer: it stays on the CPU)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.floor = torch.zeros(4)

    def forward(self, x):
        return torch.where(x > 0, self.lin(x), self.floor)


def test_a_plain_cpu_attribute_is_traced_on_the_cpu():
    graph = export.capture(from_module(PlainAttribute(), [torch.randn(2, 4)]))
    assert "where" in [n.op for n in graph.nodes]


@pytest.mark.parametrize("message, device", [
    ("Unhandled FakeTensor Device Propagation for aten.where.self, found two different devices meta, cuda:0", "cuda:0"),
    ("Unhandled FakeTensor Device Propagation for aten.where.self, found two different devices meta, cuda:1", "cuda:1"),
    ("Expected all tensors to be on the same device, but found at least two devices, meta and cpu!", "cpu"),
    ("Cannot copy out of meta tensor; no data!", "cpu"),
])
def test_the_retry_traces_on_the_device_the_error_names(monkeypatch, message, device):
    tried = []
    graph = types.SimpleNamespace(inputs=[], exported=types.SimpleNamespace(constants={}))

    def capture_module(model, inputs, name, decompose):
        tried.append(model)
        if model == "meta":
            raise CaptureError(f"torch.export failed: RuntimeError: {message}")
        return graph

    problem = types.SimpleNamespace(name="p", make_model=lambda d: str(d), make_inputs=lambda seed, d: [])
    monkeypatch.setattr(export, "capture_module", capture_module)
    assert export.capture(problem) is graph
    assert tried == ["meta", device]


def test_other_failures_are_not_retried(monkeypatch):
    def capture_module(model, inputs, name, decompose):
        raise CaptureError("the forward branches on tensor values")

    problem = types.SimpleNamespace(name="p", make_model=lambda d: str(d), make_inputs=lambda seed, d: [])
    monkeypatch.setattr(export, "capture_module", capture_module)
    with pytest.raises(CaptureError, match="branches"):
        export.capture(problem)
