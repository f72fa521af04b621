import torch
import torch.nn as nn


class Model(nn.Module):
    """2D convolution with stride 2 and dilation 2 (3x3 kernel, padding 2), with bias."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, dilation, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              dilation=dilation, padding=padding)

    def forward(self, x):
        return self.conv(x)


batch_size = 16
in_channels = 64
out_channels = 128
kernel_size = 3
stride = 2
dilation = 2
padding = 2
height = 512
width = 512


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, dilation, padding]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 12, "width": 10}
