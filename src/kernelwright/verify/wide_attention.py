"""Fused attention ops computed from their definition, for the verifier's float64 reference of an
ATen graph (backend.Lifted.float64_copy). cuDNN's and flash attention's kernels have no float64
path: on the H100 a float64 copy of a bf16 transformer block's training forward returned
non-finite values in a quarter of its output where the model's were finite (docs/benchmarks.md,
"The backward's replay settles; the RNN wavefront measured"). Each function here takes the op's
arguments and returns what the op returns: the attention output and its log-sum-exp from
softmax(q k^T * scale + mask) v in the inputs' dtype, the random-number state and the other
bookkeeping outputs as zeros of the shapes the op's meta kernel gives; the backward ops return
the gradients of that definition (autograd through it). Every tensor comes back in the strides the
op's meta kernel gives it: a graph views the results as the op lays them out (cuDNN's output of
heads-transposed inputs is [B, L, H, D] in memory, and the transformer's `transpose(1, 2).view(B,
L, E)` after it only works on that layout). With dropout the op itself runs (its mask is random: no
definition to compare with)."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _scores(q, k, attn_bias, is_causal: bool, scale):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each key head serves several query heads
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:  # (top-left aligned, as scaled_dot_product_attention's is_causal)
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_bias is not None:
        s = s.masked_fill(~attn_bias, float("-inf")) if attn_bias.dtype == torch.bool else s + attn_bias
    return s


def attention(q, k, v, attn_bias=None, is_causal: bool = False, scale=None):
    """(output, log-sum-exp of each query's scaled scores) of softmax attention, in q's dtype."""
    s = _scores(q, k, attn_bias, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    if v.shape[-3] != q.shape[-3]:
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def _meta_results(op, args, kwargs) -> tuple:
    """What `op` returns for these arguments on the meta device: its results' shapes and strides."""
    def meta(x):
        return x.to("meta") if isinstance(x, torch.Tensor) else x
    return op(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})


def _laid_out(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` (of `like`'s shape) in `like`'s strides."""
    if value.stride() == like.stride():
        return value
    return torch.empty_strided(like.shape, like.stride(), dtype=value.dtype, device=value.device).copy_(value)


def _as_op_returns(op, args, kwargs, out, lse) -> tuple:
    """`out` and `lse` in the places, shapes and strides `op` returns them; its other tensors as
    zeros."""
    shapes = _meta_results(op, args, kwargs)
    kept = shapes[1].numel() == lse.numel()  # (none where the op was not asked for it)
    results: list = [_laid_out(out, shapes[0]),
                     _laid_out(lse.reshape(shapes[1].shape), shapes[1]) if kept else lse.new_zeros(shapes[1].shape)]
    for m in shapes[2:]:
        if isinstance(m, torch.Tensor):
            dtype = out.dtype if m.dtype.is_floating_point else m.dtype
            results.append(torch.zeros(m.shape, dtype=dtype, device=out.device))
        else:
            results.append(m)
    return tuple(results)


def _gradients(grad_out, q, k, v, attn_bias, is_causal, scale) -> tuple:
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, _ = attention(*leaves, attn_bias, is_causal, scale)
        return tuple(torch.autograd.grad(out, leaves, grad_out))


def cudnn_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                    return_debug_mask=False, *, scale=None):
    """aten._scaled_dot_product_cudnn_attention from its definition."""
    args = (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
    op = aten._scaled_dot_product_cudnn_attention.default
    if dropout_p:
        return op(*args, scale=scale)
    out, lse = attention(query, key, value, attn_bias, is_causal, scale)
    return _as_op_returns(op, args, {"scale": scale}, out, lse)


def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten._scaled_dot_product_flash_attention from its definition."""
    args = (query, key, value, dropout_p, is_causal, return_debug_mask)
    op = aten._scaled_dot_product_flash_attention.default
    if dropout_p:
        return op(*args, scale=scale)
    out, lse = attention(query, key, value, None, is_causal, scale)
    return _as_op_returns(op, args, {"scale": scale}, out, lse)


def cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
                             cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    """aten._scaled_dot_product_cudnn_attention_backward from its forward's definition."""
    if dropout_p:
        return aten._scaled_dot_product_cudnn_attention_backward.default(
            grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
            cum_seq_k, max_q, max_k, dropout_p, is_causal, scale=scale)
    like = _meta_results(aten._scaled_dot_product_cudnn_attention_backward.default,
                         (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
                          cum_seq_k, max_q, max_k, dropout_p, is_causal), {"scale": scale})
    return tuple(map(_laid_out, _gradients(grad_out, query, key, value, attn_bias, is_causal, scale), like))


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """aten._scaled_dot_product_flash_attention_backward from its forward's definition."""
    if dropout_p:
        return aten._scaled_dot_product_flash_attention_backward.default(
            grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
            philox_seed, philox_offset, scale=scale)
    like = _meta_results(aten._scaled_dot_product_flash_attention_backward.default,
                         (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                          is_causal, philox_seed, philox_offset), {"scale": scale})
    return tuple(map(_laid_out, _gradients(grad_out, query, key, value, None, is_causal, scale), like))


# op -> its definition, for graphs that compute in float64
WIDE_ATTENTION = {
    aten._scaled_dot_product_cudnn_attention.default: cudnn_attention,
    aten._scaled_dot_product_flash_attention.default: flash_attention,
    aten._scaled_dot_product_cudnn_attention_backward.default: cudnn_attention_backward,
    aten._scaled_dot_product_flash_attention_backward.default: flash_attention_backward,
}

__all__ = ["WIDE_ATTENTION", "attention", "cudnn_attention", "cudnn_attention_backward", "flash_attention",
           "flash_attention_backward"]
