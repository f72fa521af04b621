import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Transposed 4x4 convolution (stride 2), 2x2 max pool, hardtanh, the mean over the image, then tanh."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, maxpool_kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.maxpool = nn.MaxPool2d(maxpool_kernel_size)

    def forward(self, x):
        x = self.maxpool(self.conv_transpose(x))
        x = F.hardtanh(x, min_val=-1.0, max_val=1.0)
        x = torch.mean(x, dim=(2, 3), keepdim=True)
        return torch.tanh(x)


batch_size = 128
in_channels = 64
out_channels = 64
kernel_size = 4
stride = 2
padding = 1
maxpool_kernel_size = 2
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, maxpool_kernel_size]


SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 4, "width": 4}
