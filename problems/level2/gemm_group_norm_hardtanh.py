import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A narrow Linear layer (256 features), group normalisation over 16 feature groups, then hardtanh."""

    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        x = self.fc(x)
        x = self.norm(x)
        return F.hardtanh(x, -2.0, 2.0)


batch_size = 32768
in_features = 1024
out_features = 256
num_groups = 16


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]


SMALL = {"batch_size": 8, "in_features": 32, "out_features": 16, "num_groups": 4}
