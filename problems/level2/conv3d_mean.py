import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3x3 convolution (no padding) followed by the mean over depth, height and width."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return torch.mean(self.conv(x), dim=(2, 3, 4))


batch_size = 16
in_channels = 32
out_channels = 64
kernel_size = 3
depth = 32
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 4, "height": 5, "width": 6}
