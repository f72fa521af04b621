import torch
import torch.nn as nn


class Model(nn.Module):
    """Log-softmax over the last dimension of long rows."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


batch_size = 8192
dim = 65536


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


SMALL = {"batch_size": 4, "dim": 96}
