import torch
import torch.nn as nn


class InvertedResidual(nn.Module):
    """1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 project, each with BatchNorm; plus the input if it fits."""

    def __init__(self, in_channels, out_channels, stride, expand_ratio):
        super().__init__()
        hidden = in_channels * expand_ratio
        layers = []
        if expand_ratio != 1:
            layers += [nn.Conv2d(in_channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x):
        out = self.conv(x)
        return x + out if self.use_residual else out


class Model(nn.Module):
    """MobileNet v2: 3x3 stem, 17 inverted-residual blocks, 1x1 conv to 1280 channels, avg pool, Linear."""

    def __init__(self, num_classes, width_mult):
        super().__init__()

        def ch(c):
            return max(2, int(c * width_mult))

        settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                    (6, 320, 1, 1)]
        channels = ch(32)
        layers = [nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(channels),
                  nn.ReLU6()]
        for t, c, n, s in settings:
            for i in range(n):
                layers.append(InvertedResidual(channels, ch(c), s if i == 0 else 1, t))
                channels = ch(c)
        last = ch(1280)
        layers += [nn.Conv2d(channels, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


batch_size = 32
num_classes = 1000
width_mult = 1.0
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, width_mult]


SMALL = {"batch_size": 2, "num_classes": 10, "width_mult": 0.125, "image_size": 24}
