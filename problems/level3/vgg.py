import torch
import torch.nn as nn

VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class Model(nn.Module):
    """VGG-16 without dropout: thirteen 3x3 conv-ReLU layers in five max-pooled stages, then three Linear layers."""

    def __init__(self, num_classes, width_mult, hidden):
        super().__init__()
        layers = []
        channels = 3
        for v in VGG16:
            if v == "M":
                layers.append(nn.MaxPool2d(2, stride=2))
            else:
                out = max(2, int(v * width_mult))
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


batch_size = 16
num_classes = 1000
width_mult = 1.0
hidden = 4096
image_size = 224


def get_inputs():
    return [torch.randn(batch_size, 3, image_size, image_size)]


def get_init_inputs():
    return [num_classes, width_mult, hidden]


SMALL = {"batch_size": 2, "num_classes": 10, "width_mult": 0.0625, "hidden": 16, "image_size": 32}
