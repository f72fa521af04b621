import torch
import torch.nn as nn


class Model(nn.Module):
    """1D convolution over a long sequence, kernel 3, no padding, with bias."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return self.conv(x)


batch_size = 64
in_channels = 128
out_channels = 256
kernel_size = 3
length = 16384


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


SMALL = {"batch_size": 2, "in_channels": 4, "out_channels": 8, "length": 32}
