import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix-vector product y = A @ x, with x a (K, 1) column."""

    def __init__(self):
        super().__init__()

    def forward(self, a, x):
        return torch.matmul(a, x)


m = 32768
k = 16384


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, 1)]


def get_init_inputs():
    return []


SMALL = {"m": 64, "k": 48}
