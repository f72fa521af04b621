import torch
import torch.nn as nn


class Model(nn.Module):
    """Hinge loss mean(clamp(1 - pred * target, min=0)) with targets in {-1, +1}."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 16384
dim = 16384


def get_inputs():
    targets = torch.randint(0, 2, (batch_size, dim)).float() * 2 - 1
    return [torch.randn(batch_size, dim), targets]


def get_init_inputs():
    return []


SMALL = {"batch_size": 4, "dim": 64}
