import torch
import torch.nn as nn


class Model(nn.Module):
    """Suffix sum along each row: flip, prefix sum, flip back."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim)


batch_size = 32768
length = 16384
scan_dim = 1


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return [scan_dim]


SMALL = {"batch_size": 4, "length": 64}
