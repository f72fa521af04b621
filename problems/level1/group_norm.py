import torch
import torch.nn as nn


class Model(nn.Module):
    """Group normalisation of an image batch (32 groups), with learned per-channel affine."""

    def __init__(self, num_groups, channels):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, channels)

    def forward(self, x):
        return self.norm(x)


batch_size = 128
channels = 256
num_groups = 32
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [num_groups, channels]


SMALL = {"batch_size": 2, "channels": 8, "num_groups": 4, "height": 6, "width": 6}
