import torch
import torch.nn as nn


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv to 4k channels, BN-ReLU-3x3 conv to k (the growth rate) channels, concatenated to the input."""

    def __init__(self, in_channels, growth_rate):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, 4 * growth_rate, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(4 * growth_rate)
        self.conv2 = nn.Conv2d(4 * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, x):
        out = self.conv1(torch.relu(self.bn1(x)))
        out = self.conv2(torch.relu(self.bn2(out)))
        return torch.cat([x, out], dim=1)


class Model(nn.Module):
    """DenseNet-121 front: 7x7 stem, max pool, a 6-layer dense block, a transition (BN-ReLU-1x1 conv, 2x2 avg pool)."""

    def __init__(self, init_channels, growth_rate, num_layers):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, init_channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(init_channels), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        )
        channels = init_channels
        layers = []
        for _ in range(num_layers):
            layers.append(DenseLayer(channels, growth_rate))
            channels += growth_rate
        self.block = nn.Sequential(*layers)
        self.transition = nn.Sequential(
            nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels // 2, 1, bias=False), nn.AvgPool2d(2, stride=2),
        )

    def forward(self, x):
        return self.transition(self.block(self.stem(x)))


batch_size = 32
init_channels = 64
growth_rate = 32
num_layers = 6
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [init_channels, growth_rate, num_layers]


SMALL = {"batch_size": 2, "init_channels": 4, "growth_rate": 2, "image_size": 24}
