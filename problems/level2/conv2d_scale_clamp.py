import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, multiplication by a constant, then clamping to [clamp_min, clamp_max]."""

    def __init__(self, in_channels, out_channels, kernel_size, scale, clamp_min, clamp_max):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.scale = scale
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        return torch.clamp(self.conv(x) * self.scale, min=self.clamp_min, max=self.clamp_max)


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
height = 224
width = 224
scale = 2.0
clamp_min = -0.5
clamp_max = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale, clamp_min, clamp_max]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 8, "width": 8}
