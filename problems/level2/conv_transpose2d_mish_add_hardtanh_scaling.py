import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Transposed 3x3 convolution doubling the image size, Mish, plus a constant, hardtanh, then scaling."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, add_value, scale):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.add_value = add_value
        self.scale = scale

    def forward(self, x):
        x = F.mish(self.conv_transpose(x)) + self.add_value
        x = F.hardtanh(x, min_val=-1.0, max_val=1.0)
        return x * self.scale


batch_size = 64
in_channels = 64
out_channels = 64
kernel_size = 3
stride = 2
padding = 1
output_padding = 1
add_value = 0.5
scale = 2.0
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, add_value, scale]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 5, "width": 5}
