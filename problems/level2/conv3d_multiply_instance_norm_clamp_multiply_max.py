import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3x3 conv, times a learned channel scale, instance norm, clamp, the scale again, max over channels."""

    def __init__(self, in_channels, out_channels, kernel_size, clamp_min, clamp_max):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.multiplier = nn.Parameter(torch.randn(out_channels, 1, 1, 1))
        self.instance_norm = nn.InstanceNorm3d(out_channels)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        x = self.conv(x) * self.multiplier
        x = self.instance_norm(x)
        x = torch.clamp(x, self.clamp_min, self.clamp_max)
        x = x * self.multiplier
        return torch.max(x, dim=1)[0]


batch_size = 128
in_channels = 3
out_channels = 16
kernel_size = 3
clamp_min = -1.0
clamp_max = 1.0
depth = 16
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, clamp_min, clamp_max]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 4, "height": 5, "width": 5}
