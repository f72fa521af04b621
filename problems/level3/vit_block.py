import torch
import torch.nn as nn


class Model(nn.Module):
    """A ViT-B/16 encoder block as torchvision builds it: LayerNorm, nn.MultiheadAttention (one
    packed in-projection, need_weights=False), residual, LayerNorm, GELU MLP, residual."""

    def __init__(self, d_model, num_heads, mlp_dim, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(d_model, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(mlp_dim, d_model), nn.Dropout(dropout))

    def forward(self, x):
        h = self.ln_1(x)
        h, _ = self.self_attention(h, h, h, need_weights=False)
        x = x + self.dropout(h)
        return x + self.mlp(self.ln_2(x))


batch_size = 32
seq_len = 197
d_model = 768
num_heads = 12
mlp_dim = 3072
dropout = 0.0


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, mlp_dim, dropout]


SMALL = {"batch_size": 2, "seq_len": 5, "d_model": 32, "num_heads": 4, "mlp_dim": 64}
