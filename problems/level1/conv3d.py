import torch
import torch.nn as nn


class Model(nn.Module):
    """3D convolution, 3x3x3 kernel, padding 1, with bias."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x):
        return self.conv(x)


batch_size = 8
in_channels = 32
out_channels = 64
kernel_size = 3
depth = 64
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


SMALL = {"batch_size": 1, "in_channels": 2, "out_channels": 3, "depth": 4, "height": 6, "width": 6}
