import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Transposed convolution doubling the image size, adding a constant, then exact GELU."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, add_value):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.add_value = add_value

    def forward(self, x):
        return F.gelu(self.conv(x) + self.add_value)


batch_size = 32
in_channels = 128
out_channels = 64
kernel_size = 4
stride = 2
padding = 1
height = 128
width = 128
add_value = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, add_value]


SMALL = {"batch_size": 2, "in_channels": 4, "out_channels": 3, "height": 6, "width": 6}
