"""Batch norm with ``momentum=None`` in train mode, in a form torch.export can trace.

Such a batch norm keeps a cumulative moving average: each call adds 1 to ``num_batches_tracked``
and blends the batch statistics in with the factor ``1 / num_batches_tracked``, which torch's
module computes as a Python float (``float(self.num_batches_tracked)``), a read of a tensor value
that export cannot trace. While a model is exported, `traceable` gives each such module a forward
computing the same with the factor as a tensor: the normalised output from ``F.batch_norm`` on the
batch's statistics (as torch's module does), then ``running = (1 - f) * running + f * batch``
with the batch's variance unbiased, as ATen's update is.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

KINDS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def cumulative(module: torch.nn.Module) -> bool:
    """Whether `module` is a train-mode batch norm keeping a cumulative average of its statistics."""
    return (type(module) in KINDS and module.training and module.track_running_stats and module.momentum is None
            and module.running_mean is not None and module.num_batches_tracked is not None)


def _forward(bn: torch.nn.Module):
    def forward(x: torch.Tensor) -> torch.Tensor:
        bn._check_input_dim(x)
        out = F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
        with torch.no_grad():
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / bn.num_batches_tracked.to(bn.running_mean.dtype)
            dims = [0, *range(2, x.dim())]
            xs = x.to(bn.running_mean.dtype)
            bn.running_mean.mul_(1 - factor).add_(factor * xs.mean(dims))
            bn.running_var.mul_(1 - factor).add_(factor * xs.var(dims, correction=1))
        return out

    return forward


@contextlib.contextmanager
def traceable(model: torch.nn.Module):
    """Within the block, every cumulative batch norm of `model` runs the traceable forward."""
    patched = [m for m in model.modules() if cumulative(m)]
    for m in patched:
        m.forward = _forward(m)
    try:
        yield len(patched)
    finally:
        for m in patched:
            del m.forward
