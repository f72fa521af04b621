import torch
import torch.nn as nn


class Model(nn.Module):
    """A ConvNeXt-T stage-1 block as torchvision builds it: a depthwise 7x7 convolution, the
    tensor permuted channels-last, LayerNorm over the channels, a 4x MLP with GELU, a learned
    per-channel layer scale, permuted back, and the residual (stochastic depth is the identity at
    rate 0). The layer scale is 0.5, of the order trained blocks hold, not the 1e-6 it starts
    from: at 1e-6 the branch would not show in the output at any tolerance."""

    def __init__(self, dim, layer_scale):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), layer_scale))

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + self.layer_scale * h.permute(0, 3, 1, 2)


batch_size = 32
dim = 96
height = width = 56
layer_scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, dim, height, width)]


def get_init_inputs():
    return [dim, layer_scale]


SMALL = {"batch_size": 2, "dim": 16, "height": 8, "width": 8}
