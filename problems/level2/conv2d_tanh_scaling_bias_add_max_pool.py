import torch
import torch.nn as nn


class Model(nn.Module):
    """3x5 convolution with stride (1, 2), tanh, scaling, plus a learned per-channel bias, then 4x4 max pool."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, scaling_factor, pool_kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.scaling_factor = scaling_factor
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.max_pool = nn.MaxPool2d(pool_kernel_size)

    def forward(self, x):
        x = torch.tanh(self.conv(x)) * self.scaling_factor + self.bias
        return self.max_pool(x)


batch_size = 128
in_channels = 16
out_channels = 64
kernel_size = (3, 5)
stride = (1, 2)
padding = (1, 2)
scaling_factor = 2.0
pool_kernel_size = 4
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, scaling_factor, pool_kernel_size]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 8, "width": 8}
