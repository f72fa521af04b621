import torch
import torch.nn as nn


class Model(nn.Module):
    """Index of the minimum over the middle dimension (int64)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.argmin(x, dim=self.dim)


batch_size = 256
dim1 = 4096
dim2 = 512
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]


SMALL = {"batch_size": 2, "dim1": 16, "dim2": 8}
