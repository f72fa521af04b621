import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A narrow Linear layer (256 features) followed by layer normalisation over the features."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)

    def forward(self, x):
        x = self.fc(x)
        return self.norm(x)


batch_size = 32768
in_features = 1024
out_features = 256


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


SMALL = {"batch_size": 8, "in_features": 32, "out_features": 16}
