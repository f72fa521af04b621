import torch
import torch.nn as nn


class Model(nn.Module):
    """Four-layer perceptron: three hidden Linear + ReLU layers and a Linear output layer."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x):
        return self.layers(x)


batch_size = 4096
in_features = 4096
hidden = 4096
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]


SMALL = {"batch_size": 8, "in_features": 32, "hidden": 64, "out_features": 16}
