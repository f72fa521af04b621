"""Shape-only kernels for the recurrent ops while torch.export traces them.

torch.export keeps `aten.lstm.input` (and the GRU / RNN ops) as one node, but to learn its output
shapes it runs the op on fake tensors through torch's Python decomposition: every time step of
every layer, op by op (24 s for KernelBench's 6-layer bidirectional LSTM over 512 steps, and 33 s
more in `run_decompositions`, whose fake-tensor mode calls the decomposition unless the op has a
Python meta function). The outputs' shapes follow from the inputs' alone, so `shapes_only()` puts
these functions in place of the decomposition's Python kernels and in torch._decomp's meta table
for the length of a capture, and restores both after.
"""
from __future__ import annotations

import contextlib

import torch
from torch._C import DispatchKey

aten = torch.ops.aten

# the keys torch._decomp registers the recurrent decompositions under as Python kernels
KEYS = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd, DispatchKey.Meta)


def _output(input, h, bidirectional, batch_first):
    """The sequence output: input's leading dims (batch and time in either order, or time alone
    unbatched) and one h-sized feature block per direction (h's last dim: the projection size
    where an LSTM has one). Time-major in memory as ATen's (a batch-first output is the transpose
    of a [time, batch, features] tensor)."""
    features = (2 if bidirectional else 1) * h.shape[-1]
    if batch_first and input.dim() == 3:
        return input.new_empty((input.shape[1], input.shape[0], features)).transpose(0, 1)
    return input.new_empty((*input.shape[:-1], features))


def lstm_shapes(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten.lstm.input -> (output, h_n, c_n); h_n and c_n are shaped as the given h_0 and c_0."""
    h0, c0 = hx
    return _output(input, h0, bidirectional, batch_first), h0.new_empty(h0.shape), c0.new_empty(c0.shape)


def rnn_shapes(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input -> (output, h_n shaped as h_0)."""
    return _output(input, hx, bidirectional, batch_first), hx.new_empty(hx.shape)


SHAPES = {aten.lstm.input: lstm_shapes, aten.gru.input: rnn_shapes,
          aten.rnn_tanh.input: rnn_shapes, aten.rnn_relu.input: rnn_shapes}


@contextlib.contextmanager
def shapes_only():
    """While inside, the recurrent ops' Python kernels compute output shapes only (a torch without
    these private tables traces them as before)."""
    try:
        from torch._decomp import meta_table
    except ImportError:
        meta_table = {}
    saved, metas = {}, {}
    for op, fn in SHAPES.items():
        table = getattr(op, "py_kernels", None)
        if not isinstance(table, dict) or not hasattr(op, "_dispatch_cache"):
            continue
        saved[op] = {k: table[k] for k in KEYS if k in table}
        for k in saved[op]:
            table[k] = fn
        op._dispatch_cache.clear()  # (it caches the kernel chosen per key)
        metas[op] = meta_table.get(op)
        meta_table[op] = fn
    try:
        yield
    finally:
        for op, kernels in saved.items():
            op.py_kernels.update(kernels)
            op._dispatch_cache.clear()
            if metas[op] is None:
                meta_table.pop(op, None)
            else:
                meta_table[op] = metas[op]
