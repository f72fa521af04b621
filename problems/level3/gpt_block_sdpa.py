import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """GPT-2 block as nanoGPT writes it: LN, causal self-attention through
    F.scaled_dot_product_attention (dropout in training), residual, LN, tanh-GELU MLP, dropout, residual."""

    def __init__(self, d_model, num_heads, dropout):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.ln_1 = nn.LayerNorm(d_model)
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = nn.Linear(4 * d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
        k = k.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
        v = v.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.resid_dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


batch_size = 8
seq_len = 1024
d_model = 768
num_heads = 12
dropout = 0.1


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, dropout]


SMALL = {"batch_size": 2, "seq_len": 8, "d_model": 32, "num_heads": 4}
