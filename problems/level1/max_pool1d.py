import torch
import torch.nn as nn


class Model(nn.Module):
    """1D max pooling, window 4, stride 2, padding 1."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


batch_size = 128
channels = 128
length = 32768
kernel_size = 4
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [kernel_size, stride, padding]


SMALL = {"batch_size": 2, "channels": 3, "length": 17}
