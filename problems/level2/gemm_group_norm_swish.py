import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear layer, group normalisation over feature groups, then swish x * sigmoid(x)."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        x = self.fc(x)
        x = self.norm(x)
        return x * torch.sigmoid(x)


batch_size = 8192
in_features = 4096
out_features = 4096
num_groups = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]


SMALL = {"batch_size": 8, "in_features": 32, "out_features": 16, "num_groups": 4}
