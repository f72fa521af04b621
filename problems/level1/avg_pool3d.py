import torch
import torch.nn as nn


class Model(nn.Module):
    """3D average pooling, 3x3x3 window, stride 2, padding 1."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.AvgPool3d(kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


batch_size = 32
channels = 32
depth = 64
height = 64
width = 128
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]


SMALL = {"batch_size": 1, "channels": 2, "depth": 5, "height": 6, "width": 7}
