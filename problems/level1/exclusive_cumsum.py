import torch
import torch.nn as nn


class Model(nn.Module):
    """Exclusive prefix sum along each row: out[i] = sum of x[:i] (first element 0)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        n = x.size(self.dim)
        shifted = torch.cat([torch.zeros_like(x.narrow(self.dim, 0, 1)), x.narrow(self.dim, 0, n - 1)], dim=self.dim)
        return torch.cumsum(shifted, dim=self.dim)


batch_size = 32768
length = 16384
scan_dim = 1


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return [scan_dim]


SMALL = {"batch_size": 4, "length": 64}
