import torch
import torch.nn as nn


class Model(nn.Module):
    """VGG-like classifier: four conv-relu-maxpool stages, global average pooling and a Linear head."""

    def __init__(self, in_channels, width, num_classes):
        super().__init__()
        layers = []
        channels = in_channels
        for i in range(4):
            out = width * 2 ** i
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.head(torch.flatten(x, 1))


batch_size = 64
in_channels = 3
base_width = 32
num_classes = 1000
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, base_width, num_classes]


SMALL = {"batch_size": 2, "base_width": 2, "num_classes": 10, "image_size": 16}
