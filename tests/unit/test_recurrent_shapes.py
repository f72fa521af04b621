"""capture.recurrent_shapes: recurrent ops traced by their output shapes, not their decomposition."""
import pytest
import torch
from torch import nn

from kernelwright.capture.export import capture_module
from kernelwright.capture.recurrent_shapes import KEYS, SHAPES, shapes_only

aten = torch.ops.aten


class Returns(nn.Module):
    """An RNN module returning its output and every final state."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, state = self.rnn(x)
        return (out, *state) if isinstance(state, tuple) else (out, state)


CASES = {
    "lstm": (lambda: nn.LSTM(4, 8, 2), (5, 3, 4)),
    "lstm_batch_first_bidirectional": (lambda: nn.LSTM(4, 8, 2, batch_first=True, bidirectional=True), (3, 5, 4)),
    "lstm_projection": (lambda: nn.LSTM(4, 8, 1, proj_size=3, batch_first=True), (3, 5, 4)),
    "lstm_unbatched": (lambda: nn.LSTM(4, 8, 2, bidirectional=True), (5, 4)),
    "gru_batch_first": (lambda: nn.GRU(4, 6, 3, batch_first=True), (2, 7, 4)),
    "gru_bidirectional": (lambda: nn.GRU(4, 6, 1, bidirectional=True), (7, 2, 4)),
    "rnn_tanh": (lambda: nn.RNN(4, 6, 2, batch_first=True), (2, 7, 4)),
    "rnn_relu_unbatched": (lambda: nn.RNN(4, 6, 1, nonlinearity="relu", bidirectional=True), (7, 4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_captured_outputs_have_eager_shapes_and_strides(case):
    make, shape = CASES[case]
    torch.manual_seed(0)
    model = Returns(make())
    x = torch.randn(shape)
    eager = model(x)
    graph = capture_module(model, [x])
    metas = [graph.meta(v) for v in graph.outputs]
    assert [(m.shape, m.stride) for m in metas] == [(tuple(t.shape), t.stride()) for t in eager]


def test_the_decomposition_does_not_run_while_capturing(monkeypatch):
    from torch._decomp import decomposition_table

    calls = []
    original = decomposition_table[aten.lstm.input]

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    saved = {k: aten.lstm.input.py_kernels[k] for k in KEYS if k in aten.lstm.input.py_kernels}
    monkeypatch.setitem(decomposition_table, aten.lstm.input, spy)
    for k in saved:
        monkeypatch.setitem(aten.lstm.input.py_kernels, k, spy)
    aten.lstm.input._dispatch_cache.clear()
    try:
        model = Returns(nn.LSTM(4, 8, 2, batch_first=True))
        graph = capture_module(model, [torch.randn(3, 40, 4)])
        assert [n.op for n in graph.nodes].count("lstm") == 1
        assert calls == []
        # outside the capture the decomposition is back: a plain torch.export runs it
        torch.export.export(model, (torch.randn(3, 4, 4),))
        assert calls
    finally:
        aten.lstm.input._dispatch_cache.clear()


def test_the_kernels_are_restored_after_a_capture_that_fails():
    from torch._decomp import meta_table

    before = {op: (dict(op.py_kernels), meta_table.get(op)) for op in SHAPES}
    with pytest.raises(RuntimeError), shapes_only():
        assert all(op.py_kernels[k] is SHAPES[op] for op in SHAPES for k in KEYS if k in before[op][0])
        raise RuntimeError("tracing failed")
    assert {op: (dict(op.py_kernels), meta_table.get(op)) for op in SHAPES} == before
