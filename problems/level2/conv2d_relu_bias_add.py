import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, ReLU, then adding a learned per-channel bias."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.02)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return x + self.bias


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
height = 224
width = 224


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 8, "width": 8}
