import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Transposed 3x3x3 conv doubling each extent, plus a scalar, LayerNorm over channels, avg pool, GELU."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_padding, sum_weight):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding, output_padding=output_padding)
        self.sum_weight = nn.Parameter(torch.tensor(sum_weight))
        self.norm = nn.LayerNorm(out_channels)
        self.avg_pool = nn.AvgPool3d(2)

    def forward(self, x):
        x = self.conv_transpose(x) + self.sum_weight
        x = self.norm(x.permute(0, 2, 3, 4, 1)).permute(0, 4, 1, 2, 3)
        return F.gelu(self.avg_pool(x))


batch_size = 16
in_channels = 32
out_channels = 64
kernel_size = 3
stride = 2
padding = 1
output_padding = 1
sum_weight = 1.0
depth = 16
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_padding, sum_weight]


SMALL = {"batch_size": 2, "in_channels": 2, "out_channels": 4, "depth": 2, "height": 3, "width": 3}
