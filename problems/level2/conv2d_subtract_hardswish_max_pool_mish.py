import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 convolution, minus a constant, HardSwish, 2x2 max pool, then Mish."""

    def __init__(self, in_channels, out_channels, kernel_size, subtract_value, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.subtract_value = subtract_value
        self.pool = nn.MaxPool2d(pool_kernel_size)

    def forward(self, x):
        x = F.hardswish(self.conv(x) - self.subtract_value)
        return F.mish(self.pool(x))


batch_size = 128
in_channels = 32
out_channels = 64
kernel_size = 3
subtract_value = 0.5
pool_kernel_size = 2
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, subtract_value, pool_kernel_size]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 6, "width": 6}
