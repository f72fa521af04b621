import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Depthwise 3x3 convolution without bias, batch normalisation, then ReLU6 (a MobileNet layer)."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu6(self.bn(self.conv(x)))


batch_size = 128
channels = 256
kernel_size = 3
height = 56
width = 56


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]


SMALL = {"batch_size": 2, "channels": 4, "height": 6, "width": 6}
