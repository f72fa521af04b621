import torch
import torch.nn as nn


class Model(nn.Module):
    """Instance normalisation: each (sample, channel) image normalised on its own, no affine."""

    def __init__(self, channels):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels)

    def forward(self, x):
        return self.norm(x)


batch_size = 128
channels = 256
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]


SMALL = {"batch_size": 2, "channels": 3, "height": 6, "width": 6}
