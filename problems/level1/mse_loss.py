import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean squared error between predictions and targets (a scalar)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


batch_size = 16384
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


SMALL = {"batch_size": 4, "dim": 64}
