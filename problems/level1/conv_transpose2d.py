import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 2D convolution that doubles the image size (kernel 4, stride 2, padding 1)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.conv(x)


batch_size = 32
in_channels = 128
out_channels = 64
kernel_size = 4
stride = 2
padding = 1
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]


SMALL = {"batch_size": 2, "in_channels": 4, "out_channels": 3, "height": 6, "width": 6}
