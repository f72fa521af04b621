import torch
import torch.nn as nn


def conv_bn(in_channels, out_channels, stride):
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU())


def depthwise_separable(in_channels, out_channels, stride):
    return nn.Sequential(
        nn.Conv2d(in_channels, in_channels, 3, stride=stride, padding=1, groups=in_channels, bias=False),
        nn.BatchNorm2d(in_channels), nn.ReLU(),
        nn.Conv2d(in_channels, out_channels, 1, bias=False),
        nn.BatchNorm2d(out_channels), nn.ReLU(),
    )


class Model(nn.Module):
    """MobileNet v1: 3x3 stem, 13 depthwise-separable conv-bn-relu layers (width alpha), avg pool, Linear."""

    def __init__(self, num_classes, alpha):
        super().__init__()

        def ch(c):
            return max(2, int(c * alpha))

        plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
        layers = [conv_bn(3, ch(32), 2)]
        channels = ch(32)
        for out, stride in plan:
            layers.append(depthwise_separable(channels, ch(out), stride))
            channels = ch(out)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.fc(torch.flatten(x, 1))


batch_size = 32
num_classes = 1000
alpha = 1.0
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, alpha]


SMALL = {"batch_size": 2, "num_classes": 10, "alpha": 0.0625, "image_size": 24}
