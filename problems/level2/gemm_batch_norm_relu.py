import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer, batch normalisation over the batch (training mode: batch statistics, running
    statistics updated), then ReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features)

    def forward(self, x):
        return torch.relu(self.bn(self.linear(x)))


batch_size = 8192
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


SMALL = {"batch_size": 16, "in_features": 8, "out_features": 12}
