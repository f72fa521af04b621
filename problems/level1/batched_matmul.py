import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix multiplication C[b] = A[b] @ B[b]."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


batch_size = 128
m = 1024
k = 1024
n = 1024


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []


SMALL = {"batch_size": 3, "m": 16, "k": 24, "n": 8}
