import torch
import torch.nn as nn


class Model(nn.Module):
    """Six-layer GRU over a time-major sequence from a given initial state, returning the final hidden state of every layer."""

    def __init__(self, input_size, hidden_size, num_layers, batch_size):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size, num_layers=num_layers)
        self.register_buffer("h0", torch.randn(num_layers, batch_size, hidden_size))

    def forward(self, x):
        _, h_n = self.gru(x, self.h0)
        return h_n


batch_size = 10
seq_len = 512
input_size = 128
hidden_size = 256
num_layers = 6


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, batch_size]


SMALL = {"batch_size": 2, "seq_len": 3, "input_size": 8, "hidden_size": 8, "num_layers": 2}
