import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped 3x3x3 convolution (dilation 2, padding keeps the size), 2x2x2 max pool, then sigmoid."""

    def __init__(self, in_channels, out_channels, kernel_size, dilation, groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=dilation * (kernel_size // 2),
                              dilation=dilation, groups=groups)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        return torch.sigmoid(self.pool(self.conv(x)))


batch_size = 16
in_channels = 64
out_channels = 64
kernel_size = 3
dilation = 2
groups = 4
depth = 16
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, dilation, groups]


SMALL = {"batch_size": 2, "in_channels": 4, "out_channels": 4, "groups": 2, "depth": 4, "height": 6, "width": 6}
