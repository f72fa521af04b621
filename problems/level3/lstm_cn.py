import torch
import torch.nn as nn


class Model(nn.Module):
    """Six-layer LSTM over a batch-first sequence from given initial states, returning the final cell state of every layer."""

    def __init__(self, input_size, hidden_size, num_layers, batch_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.register_buffer("h0", torch.randn(num_layers, batch_size, hidden_size))
        self.register_buffer("c0", torch.randn(num_layers, batch_size, hidden_size))

    def forward(self, x):
        _, (_, c_n) = self.lstm(x, (self.h0, self.c0))
        return c_n


batch_size = 10
seq_len = 512
input_size = 128
hidden_size = 256
num_layers = 6


def get_inputs():
    return [torch.randn(batch_size, seq_len, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, batch_size]


SMALL = {"batch_size": 2, "seq_len": 3, "input_size": 8, "hidden_size": 8, "num_layers": 2}
