import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Convolution with a 3x5x5 kernel, leaky ReLU, plus a learned per-channel tensor, clamp to [-1, 1], then GELU."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=padding)
        self.sum_tensor = nn.Parameter(torch.randn(out_channels, 1, 1, 1))

    def forward(self, x):
        x = F.leaky_relu(self.conv(x), negative_slope=0.2)
        x = torch.clamp(x + self.sum_tensor, min=-1.0, max=1.0)
        return F.gelu(x)


batch_size = 64
in_channels = 3
out_channels = 32
kernel_size = (3, 5, 5)
padding = (1, 2, 2)
depth = 16
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 3, "depth": 3, "height": 5, "width": 5}
