import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 3x3 conv doubling the image, plus a channel bias, clamp to [0, 1], scale, clamp, unscale."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, scaling_factor):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv_transpose(x) + self.bias
        x = torch.clamp(x, min=0.0, max=1.0)
        x = x * self.scaling_factor
        x = torch.clamp(x, min=0.0, max=1.0)
        return x / self.scaling_factor


batch_size = 128
in_channels = 32
out_channels = 64
kernel_size = 3
stride = 2
padding = 1
output_padding = 1
scaling_factor = 2.0
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, scaling_factor]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 5, "width": 5}
