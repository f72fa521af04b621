import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    """Two 3x3 conv-bn layers plus the shortcut (a strided 1x1 conv-bn where the shape changes), then ReLU."""

    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


class Model(nn.Module):
    """ResNet-18: 7x7 stem and max pool, four stages of two basic blocks, global average pool, Linear classifier."""

    def __init__(self, num_classes, base_width):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks = []
        channels = base_width
        for i, n in enumerate((2, 2, 2, 2)):
            out = base_width * 2 ** i
            for j in range(n):
                blocks.append(BasicBlock(channels, out, 2 if i > 0 and j == 0 else 1))
                channels = out
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


SMALL = {"batch_size": 2, "num_classes": 10, "base_width": 4, "image_size": 24}
