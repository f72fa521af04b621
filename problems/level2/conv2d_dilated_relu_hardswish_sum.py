import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 convolution with dilation 2, ReLU, HardSwish, then the sum over the channels."""

    def __init__(self, in_channels, out_channels, kernel_size, dilation):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=dilation * (kernel_size // 2),
                              dilation=dilation)

    def forward(self, x):
        x = F.hardswish(torch.relu(self.conv(x)))
        return torch.sum(x, dim=1, keepdim=True)


batch_size = 128
in_channels = 32
out_channels = 64
kernel_size = 3
dilation = 2
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, dilation]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 6, "width": 6}
