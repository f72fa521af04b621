import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 2D convolution (groups = channels), 3x3 kernel, padding 1, with bias."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x):
        return self.conv(x)


batch_size = 64
channels = 128
kernel_size = 3
height = 256
width = 256


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]


SMALL = {"batch_size": 2, "channels": 4, "height": 8, "width": 8}
