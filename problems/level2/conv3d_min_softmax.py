import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3x3 convolution, the minimum over depth, then softmax over the channels."""

    def __init__(self, in_channels, out_channels, kernel_size, dim):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.dim = dim

    def forward(self, x):
        x = torch.min(self.conv(x), dim=self.dim)[0]
        return torch.softmax(x, dim=1)


batch_size = 128
in_channels = 3
out_channels = 24
kernel_size = 3
dim = 2
depth = 24
height = 48
width = 48


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, dim]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 4, "height": 5, "width": 5}
