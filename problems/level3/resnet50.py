import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, each with BatchNorm, plus the shortcut, then ReLU."""

    expansion = 4

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        out_channels = channels * self.expansion
        self.conv1 = nn.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


class Model(nn.Module):
    """ResNet-50: 7x7 stem, max pool, four stages of 3, 4, 6, 3 bottleneck blocks, global average pool, Linear."""

    def __init__(self, num_classes, base_width):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks = []
        channels = base_width
        for i, n in enumerate((3, 4, 6, 3)):
            width = base_width * 2 ** i
            for j in range(n):
                blocks.append(Bottleneck(channels, width, 2 if i > 0 and j == 0 else 1))
                channels = width * Bottleneck.expansion
        self.layers = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


batch_size = 16
num_classes = 1000
base_width = 64
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, base_width]


SMALL = {"batch_size": 2, "num_classes": 10, "base_width": 2, "image_size": 24}
