import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed 3x3x3 convolution (stride 2), batch normalisation, then two 2x2x2 average pools."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.batch_norm = nn.BatchNorm3d(out_channels)
        self.avg_pool1 = nn.AvgPool3d(2)
        self.avg_pool2 = nn.AvgPool3d(2)

    def forward(self, x):
        x = self.batch_norm(self.conv_transpose(x))
        return self.avg_pool2(self.avg_pool1(x))


batch_size = 32
in_channels = 8
out_channels = 16
kernel_size = 3
stride = 2
padding = 1
depth = 32
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 3, "height": 3, "width": 4}
