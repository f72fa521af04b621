import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """1-D convolution (kernel 7, stride 2), LayerNorm over the channels, GELU, then average pooling by 2."""

    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2)
        self.norm = nn.LayerNorm(out_channels)
        self.pool = nn.AvgPool1d(2)

    def forward(self, x):
        x = self.conv(x)
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return self.pool(F.gelu(x))


batch_size = 64
in_channels = 64
out_channels = 128
kernel_size = 7
stride = 2
length = 8192


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "length": 16}
