import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped transposed 4x4 conv (stride 2), batch norm, tanh, 2x2 max pool, then group norm."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, groups, num_groups):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, groups=groups)
        self.batch_norm = nn.BatchNorm2d(out_channels)
        self.max_pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        x = torch.tanh(self.batch_norm(self.conv_transpose(x)))
        return self.group_norm(self.max_pool(x))


batch_size = 128
in_channels = 64
out_channels = 128
kernel_size = 4
stride = 2
padding = 1
groups = 8
num_groups = 4
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, groups, num_groups]


SMALL = {"batch_size": 2, "in_channels": 4, "out_channels": 4, "groups": 2, "num_groups": 2, "height": 3, "width": 3}
