import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix multiplication with a transposed right operand: C = A @ B.T, B stored (N, K)."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b.T)


m = 8192
k = 4096
n = 4096


def get_inputs():
    return [torch.randn(m, k), torch.randn(n, k)]


def get_init_inputs():
    return []


SMALL = {"m": 48, "k": 32, "n": 16}
