import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalisation over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(hidden) * 0.1 + 1.0)

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


batch_size = 65536
hidden = 8192
eps = 1e-6


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, eps]


SMALL = {"batch_size": 4, "hidden": 64}
