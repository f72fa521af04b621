import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, instance normalisation, then division by a constant."""

    def __init__(self, in_channels, out_channels, kernel_size, divide_by):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.instance_norm = nn.InstanceNorm2d(out_channels)
        self.divide_by = divide_by

    def forward(self, x):
        return self.instance_norm(self.conv(x)) / self.divide_by


batch_size = 128
in_channels = 3
out_channels = 64
kernel_size = 3
divide_by = 2.0
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, divide_by]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 6, "width": 6}
