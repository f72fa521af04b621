import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, exact GELU, then multiplication by a constant scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        x = self.fc(x)
        return F.gelu(x) * self.scale


batch_size = 8192
in_features = 4096
out_features = 4096
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]


SMALL = {"batch_size": 8, "in_features": 32, "out_features": 16}
