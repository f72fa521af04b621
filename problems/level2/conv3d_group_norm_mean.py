import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3x3 convolution, group normalisation (8 groups), then each sample's mean over channels and space."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = self.group_norm(self.conv(x))
        return x.mean(dim=[1, 2, 3, 4])


batch_size = 128
in_channels = 3
out_channels = 32
kernel_size = 3
num_groups = 8
depth = 16
height = 48
width = 48


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 4, "num_groups": 2, "depth": 4, "height": 5, "width": 5}
