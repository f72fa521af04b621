import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3x3 convolution, softmax over the channels, then two 2x2x2 max pools."""

    def __init__(self, in_channels, out_channels, kernel_size, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.pool1 = nn.MaxPool3d(pool_kernel_size)
        self.pool2 = nn.MaxPool3d(pool_kernel_size)

    def forward(self, x):
        x = torch.softmax(self.conv(x), dim=1)
        return self.pool2(self.pool1(x))


batch_size = 64
in_channels = 3
out_channels = 16
kernel_size = 3
pool_kernel_size = 2
depth = 32
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, pool_kernel_size]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 6, "height": 6, "width": 6}
