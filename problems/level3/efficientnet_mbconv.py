import torch
import torch.nn as nn
import torch.nn.functional as F


class MBConv(nn.Module):
    """MBConv: 1x1 expand, depthwise kxk, squeeze-excitation, 1x1 project (BatchNorm, Swish), plus the input."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, expand_ratio, se_ratio=0.25):
        super().__init__()
        hidden = in_channels * expand_ratio
        self.expand = None
        if expand_ratio != 1:
            self.expand = nn.Sequential(nn.Conv2d(in_channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                                        nn.SiLU())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel_size, stride=stride, padding=kernel_size // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.SiLU(),
        )
        se_channels = max(1, int(in_channels * se_ratio))
        self.se_reduce = nn.Conv2d(hidden, se_channels, 1)
        self.se_expand = nn.Conv2d(se_channels, hidden, 1)
        self.project = nn.Sequential(nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels))
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x):
        out = x if self.expand is None else self.expand(x)
        out = self.depthwise(out)
        scale = torch.sigmoid(self.se_expand(F.silu(self.se_reduce(out.mean(dim=(2, 3), keepdim=True)))))
        out = self.project(out * scale)
        return x + out if self.use_residual else out


class Model(nn.Module):
    """EfficientNet-B0 (no dropout or stochastic depth): 3x3 stem, 16 MBConv blocks, 1x1 head, avg pool, Linear."""

    def __init__(self, num_classes, width_mult):
        super().__init__()

        def ch(c):
            return max(2, int(c * width_mult))

        settings = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3),
                    (6, 112, 3, 1, 5), (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]
        channels = ch(32)
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.SiLU())
        blocks = []
        for t, c, n, s, k in settings:
            for i in range(n):
                blocks.append(MBConv(channels, ch(c), k, s if i == 0 else 1, t))
                channels = ch(c)
        self.blocks = nn.Sequential(*blocks)
        last = ch(1280)
        self.head = nn.Sequential(nn.Conv2d(channels, last, 1, bias=False), nn.BatchNorm2d(last), nn.SiLU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x):
        x = self.avgpool(self.head(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(x, 1))


batch_size = 32
num_classes = 1000
width_mult = 1.0
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, width_mult]


SMALL = {"batch_size": 2, "num_classes": 10, "width_mult": 0.125, "image_size": 24}
