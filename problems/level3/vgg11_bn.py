import torch
import torch.nn as nn


class Model(nn.Module):
    """VGG-11 with batch norm: eight 3x3 conv-bn-relu layers in five stages, each stage ending in a
    2x2 max pool, then a three-layer classifier (dropout between)."""

    def __init__(self, num_classes, width):
        super().__init__()
        plan = [[64], [128], [256, 256], [512, 512], [512, 512]]
        layers, channels = [], 3
        for stage in plan:
            for out in stage:
                out = max(2, int(out * width))
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
                channels = out
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        hidden = max(4, int(4096 * width))
        self.classifier = nn.Sequential(nn.Linear(channels * 49, hidden), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(hidden, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


batch_size = 16
num_classes = 1000
width = 1.0
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, width]


SMALL = {"batch_size": 2, "num_classes": 10, "width": 0.0625, "image_size": 32}
