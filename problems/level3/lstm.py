import torch
import torch.nn as nn


class Model(nn.Module):
    """Two-layer LSTM over a batch-first sequence (zero initial state), returning the last layer's final hidden state."""

    def __init__(self, input_size, hidden_size, num_layers):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True)

    def forward(self, x):
        _, (h_n, _) = self.lstm(x)
        return h_n[-1]


batch_size = 64
seq_len = 128
input_size = 512
hidden_size = 1024
num_layers = 2


def get_inputs():
    return [torch.randn(batch_size, seq_len, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]


SMALL = {"batch_size": 2, "seq_len": 4, "input_size": 8, "hidden_size": 16}
