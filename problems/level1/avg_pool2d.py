import torch
import torch.nn as nn


class Model(nn.Module):
    """2D average pooling, 3x3 window, stride 2, padding 1 (padding counted in the average)."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


batch_size = 128
channels = 64
height = 256
width = 256
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]


SMALL = {"batch_size": 2, "channels": 3, "height": 9, "width": 8}
