import torch
import torch.nn as nn


class YBlock(nn.Module):
    """RegNetY block: 1x1 conv-bn-relu, grouped 3x3 conv-bn-relu, squeeze-excitation, 1x1 conv-bn, shortcut, ReLU."""

    def __init__(self, in_channels, out_channels, stride, group_width, se_ratio):
        super().__init__()
        groups = out_channels // group_width
        self.conv1 = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        se_channels = max(1, int(in_channels * se_ratio))
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(out_channels, se_channels, 1), nn.ReLU(),
                                nn.Conv2d(se_channels, out_channels, 1), nn.Sigmoid())
        self.conv3 = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = out * self.se(out)
        out = self.bn3(self.conv3(out))
        identity = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(out + identity)


class Model(nn.Module):
    """RegNetY-400MF: 3x3 stem, four stages (1, 3, 6, 6 blocks) of Y blocks, global average pool, Linear."""

    def __init__(self, num_classes, width_mult, group_width):
        super().__init__()
        stem = int(32 * width_mult)
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU())
        blocks = []
        channels = stem
        for depth, width in zip((1, 3, 6, 6), (48, 104, 208, 440)):
            out = int(width * width_mult)
            for i in range(depth):
                blocks.append(YBlock(channels, out, 2 if i == 0 else 1, group_width, 0.25))
                channels = out
        self.stages = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.avgpool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


batch_size = 32
num_classes = 1000
width_mult = 1.0
group_width = 8
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, width_mult, group_width]


SMALL = {"batch_size": 2, "num_classes": 10, "width_mult": 0.25, "group_width": 2, "image_size": 24}
