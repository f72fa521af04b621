import torch
import torch.nn as nn


class Model(nn.Module):
    """Inclusive prefix product along each row (factors near 1, so products stay in range)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumprod(x, dim=self.dim)


batch_size = 131072
length = 4096
scan_dim = 1


def get_inputs():
    # factors uniform in [0.9, 1.1): the product of 4096 of them stays near e^-7
    return [torch.rand(batch_size, length) * 0.2 + 0.9]


def get_init_inputs():
    return [scan_dim]


SMALL = {"batch_size": 4, "length": 64}
