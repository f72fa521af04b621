import torch
import torch.nn as nn


class Model(nn.Module):
    """Dilated 1-D conv to twice the channels, the gate tanh(a) * sigmoid(b) of its two halves, plus the input."""

    def __init__(self, channels, kernel_size, dilation):
        super().__init__()
        self.conv = nn.Conv1d(channels, 2 * channels, kernel_size, padding=dilation * (kernel_size // 2),
                              dilation=dilation)

    def forward(self, x):
        a, b = self.conv(x).chunk(2, dim=1)
        return x + torch.tanh(a) * torch.sigmoid(b)


batch_size = 64
channels = 128
kernel_size = 3
dilation = 2
length = 4096


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [channels, kernel_size, dilation]


SMALL = {"batch_size": 2, "channels": 4, "length": 16}
