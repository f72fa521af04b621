"""The fused attention ops computed from their definition (verify/wide_attention.py): the float64
reference of a graph holding cuDNN's or flash attention's ops, which have no float64 kernels."""
import operator

import pytest
import torch
import torch.nn.functional as F

from kernelwright.verify import wide_attention as wa

aten = torch.ops.aten


def _qkv(heads_kv=4, L=6, S=6):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, L, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, heads_kv, S, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, heads_kv, S, 8, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_bias", "grouped", "scale"])
def test_attention_is_sdpa_and_its_log_sum_exp(case):
    q, k, v = _qkv(heads_kv=2 if case == "grouped" else 4)
    bias = None
    if case == "bool_mask":
        bias = torch.rand(6, 6, generator=torch.Generator().manual_seed(1)) > 0.3
        bias[:, 0] = True  # (no row fully masked)
    if case == "float_bias":
        bias = torch.randn(2, 1, 6, 6, dtype=torch.float64)
    causal, scale = case == "causal", (0.3 if case == "scale" else None)
    out, lse = wa.attention(q, k, v, bias, causal, scale)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, scale=scale,
                                          enable_gqa=case == "grouped")
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    kk = k.repeat_interleave(2, dim=1) if case == "grouped" else k
    s = q @ kk.transpose(-2, -1) * (scale or 8 ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)


def test_the_forward_ops_return_what_the_op_returns_in_its_shapes():
    """cuDNN's log-sum-exp is [B, H, L, 1], flash's [B, H, L]; the bookkeeping outputs are zeros of
    the op's shapes (and its integers as they are)."""
    q, k, v = _qkv()
    out, lse = wa.attention(q, k, v, None, True, 0.5)
    got = wa.cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=0.5)
    assert len(got) == 9 and got[1].shape == (2, 4, 6, 1) and got[4] == 6 and got[5] == 6
    torch.testing.assert_close(got[0], out, rtol=0, atol=0)
    torch.testing.assert_close(got[1][..., 0], lse, rtol=0, atol=0)
    assert got[6].shape == () and got[6].dtype == torch.int64 and int(got[6]) == 0
    got = wa.flash_attention(q, k, v, 0.0, True, False, scale=0.5)
    assert len(got) == 9 and got[1].shape == (2, 4, 6)
    torch.testing.assert_close(got[0], out, rtol=0, atol=0)


def test_the_backward_ops_are_the_gradients_of_the_definition():
    q, k, v = _qkv()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.5)
    g = torch.randn_like(out)
    want = torch.autograd.grad(out, leaves, g)
    o, lse = wa.attention(q, k, v, None, True, 0.5)
    none = torch.zeros(())
    cudnn = wa.cudnn_attention_backward(g, q, k, v, o, lse, none, none, None, none, none, 6, 6, 0.0, True, scale=0.5)
    flash = wa.flash_attention_backward(g, q, k, v, o, lse, none, none, 6, 6, 0.0, True, none, none, scale=0.5)
    for got in (cudnn, flash):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_graphs_float64_copy_computes_cudnn_attention_from_its_definition():
    """backend.Lifted.float64_copy on a graph calling cuDNN's attention op (no CPU or float64
    kernel): the copy runs, in float64, and returns the definition's values."""
    from kernelwright.backend import Lifted

    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    att = graph.call_function(aten._scaled_dot_product_cudnn_attention.default, (q, k, v, None, True),
                              {"is_causal": True, "scale": 0.25})
    out = graph.call_function(operator.getitem, (att, 0))
    lse = graph.call_function(operator.getitem, (att, 1))
    graph.output((out, lse))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x = [t.float() for t in _qkv()]
    twin = Lifted(gm, x, []).float64_copy()
    got = twin(*[t.double() for t in x])
    want = wa.attention(*[t.double() for t in x], None, True, 0.25)
    assert got[0].dtype == torch.float64
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1][..., 0], want[1], rtol=0, atol=0)


def test_results_come_back_in_the_ops_strides_so_a_graphs_views_of_them_work():
    """Heads-transposed inputs ([B, L, H, D] in memory, as a transformer makes them): the ops lay out
    their output (and the backward its gradients) the same way, and the graph after them views the
    output as [B, L, H * D] without a copy; a contiguous result would make that view fail."""
    x = torch.randn(2, 6, 4, 8, dtype=torch.float64)
    q, k, v = ((x + i).transpose(1, 2) for i in range(3))
    g = torch.randn(2, 6, 4, 8, dtype=torch.float64).transpose(1, 2)
    none = torch.zeros(())
    cudnn = wa.cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=0.5)
    flash = wa.flash_attention(q, k, v, 0.0, True, False, scale=0.5)
    for out, op in ((cudnn[0], aten._scaled_dot_product_cudnn_attention.default),
                    (flash[0], aten._scaled_dot_product_flash_attention.default)):
        assert out.stride() == (192, 8, 32, 1)
        torch.testing.assert_close(out.transpose(1, 2).view(2, 6, 32),
                                   wa.attention(q, k, v, None, True, 0.5)[0].transpose(1, 2).reshape(2, 6, 32),
                                   rtol=0, atol=0)
    grads = [wa.cudnn_attention_backward(g, q, k, v, cudnn[0], cudnn[1], none, none, None, none, none, 6, 6, 0.0,
                                         True, scale=0.5),
             wa.flash_attention_backward(g, q, k, v, flash[0], flash[1], none, none, 6, 6, 0.0, True, none, none,
                                         scale=0.5)]
    for got in grads:
        assert [t.stride() for t in got] == [(192, 8, 32, 1)] * 3
        for a, b in zip(got, wa._gradients(g, q, k, v, None, True, 0.5)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
