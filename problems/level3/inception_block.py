import torch
import torch.nn as nn


class BasicConv2d(nn.Module):
    """Convolution without bias, BatchNorm, ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Inception(nn.Module):
    """Four branches concatenated: 1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max pool then 1x1."""

    def __init__(self, in_channels, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, 1)
        self.branch2 = nn.Sequential(BasicConv2d(in_channels, ch3x3red, 1), BasicConv2d(ch3x3red, ch3x3, 3, padding=1))
        self.branch3 = nn.Sequential(BasicConv2d(in_channels, ch5x5red, 1), BasicConv2d(ch5x5red, ch5x5, 5, padding=2))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), BasicConv2d(in_channels, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], dim=1)


class Model(nn.Module):
    """GoogLeNet front: stem (7x7, max pool, 1x1, 3x3, max pool), inception modules 3a and 3b, 3x3/2 max pool."""

    def __init__(self, width_mult):
        super().__init__()

        def ch(c):
            return max(2, int(c * width_mult))

        self.stem = nn.Sequential(
            BasicConv2d(3, ch(64), 7, stride=2, padding=3), nn.MaxPool2d(3, stride=2, ceil_mode=True),
            BasicConv2d(ch(64), ch(64), 1), BasicConv2d(ch(64), ch(192), 3, padding=1),
            nn.MaxPool2d(3, stride=2, ceil_mode=True),
        )
        self.inception3a = Inception(ch(192), ch(64), ch(96), ch(128), ch(16), ch(32), ch(32))
        out3a = ch(64) + ch(128) + ch(32) + ch(32)
        self.inception3b = Inception(out3a, ch(128), ch(128), ch(192), ch(32), ch(96), ch(64))
        self.maxpool = nn.MaxPool2d(3, stride=2, ceil_mode=True)

    def forward(self, x):
        return self.maxpool(self.inception3b(self.inception3a(self.stem(x))))


batch_size = 32
width_mult = 1.0
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [width_mult]


SMALL = {"batch_size": 2, "width_mult": 0.0625, "image_size": 24}
