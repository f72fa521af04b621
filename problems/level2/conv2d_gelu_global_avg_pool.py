import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 convolution, GELU, then global average pooling: the convolution's output is only averaged."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)

    def forward(self, x):
        return F.adaptive_avg_pool2d(F.gelu(self.conv(x)), 1).flatten(1)


batch_size = 64
in_channels = 32
out_channels = 128
kernel_size = 3
height = 112
width = 112


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 6, "width": 6}
