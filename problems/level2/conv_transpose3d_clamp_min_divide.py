import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 3x3x3 convolution (stride 2), clamped from below, then divided by a constant."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, min_value, divisor):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.min_value = min_value
        self.divisor = divisor

    def forward(self, x):
        x = torch.clamp(self.conv_transpose(x), min=self.min_value)
        return x / self.divisor


batch_size = 32
in_channels = 32
out_channels = 16
kernel_size = 3
stride = 2
padding = 1
min_value = -1.0
divisor = 2.0
depth = 16
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, min_value, divisor]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 2, "height": 3, "width": 3}
