import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """RMSNorm as Llama's reference code writes it: computed in float32, returned in the input's dtype."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Model(nn.Module):
    """A Llama decoder layer: RMSNorm, grouped-query causal attention with rotary position
    embeddings (cos/sin tables as buffers, rotate-half form), residual, RMSNorm, SwiGLU MLP,
    residual. No biases."""

    def __init__(self, d_model, num_heads, num_kv_heads, ffn_dim, max_seq_len, rope_theta):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.input_layernorm = RMSNorm(d_model)
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=False)
        self.post_attention_layernorm = RMSNorm(d_model)
        self.gate_proj = nn.Linear(d_model, ffn_dim, bias=False)
        self.up_proj = nn.Linear(d_model, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, d_model, bias=False)
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos_cached[:t].to(x.dtype), self.sin_cached[:t].to(x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


batch_size = 4
seq_len = 1024
d_model = 1024
num_heads = 16
num_kv_heads = 4
ffn_dim = 2816
max_seq_len = 2048
rope_theta = 10000.0


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, num_kv_heads, ffn_dim, max_seq_len, rope_theta]


SMALL = {"batch_size": 2, "seq_len": 8, "d_model": 32, "num_heads": 4, "num_kv_heads": 2, "ffn_dim": 64,
         "max_seq_len": 16}
