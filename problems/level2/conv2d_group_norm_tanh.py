import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, group normalisation (16 groups), then tanh."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        return torch.tanh(self.norm(self.conv(x)))


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
num_groups = 16
height = 224
width = 224


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "num_groups": 2, "height": 8, "width": 8}
