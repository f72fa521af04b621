"""`Fn(fn)`: a module whose forward is `fn(x)`, to capture one op or a short chain in a test."""
from torch import nn


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
