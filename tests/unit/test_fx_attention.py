"""By-hand attention in Dynamo's torch-level graphs rewritten as one scaled_dot_product_attention
call (plan/fx_attention.py): the forms it matches, the ones it must leave alone, and the rewritten
graph's values against the original's."""
import math

import pytest
import torch
import torch.nn.functional as F

from kernelwright.plan.fx_attention import sdpa_in_fx


def _rewritten(fn, inputs, policy="fp32"):
    """(rewrites made, the rewritten graph's result, the original's) of fn traced by Dynamo."""
    made = []

    def capture(gm, example_inputs):
        made.append(sdpa_in_fx(gm, policy))
        assert not made[-1] or any(n.target is F.scaled_dot_product_attention for n in gm.graph.nodes)
        return gm.forward

    torch._dynamo.reset()
    try:
        got = torch.compile(fn, backend=capture, fullgraph=True)(*inputs)
    finally:
        torch._dynamo.reset()
    return sum(made), got, fn(*inputs)


def _qkv(b=2, h=3, s=5, l=7, d=4, dv=6):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, h, s, d, generator=g), torch.randn(b, h, l, d, generator=g),
            torch.randn(b, h, l, dv, generator=g))


FORMS = {
    "divided": lambda q, k, v: torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(4), dim=-1), v),
    "multiplied": lambda q, k, v: F.softmax((q @ k.transpose(2, 3)) * 0.3, dim=3) @ v,
    "unscaled": lambda q, k, v: torch.matmul(torch.matmul(q, k.transpose(-1, -2)).softmax(-1), v),
    "mT": lambda q, k, v: torch.softmax(q @ k.mT / 2.0, -1) @ v,
    "3-D": lambda q, k, v: torch.softmax(q[0] @ k[0].transpose(1, 2) / 2.0, dim=-1) @ v[0],
}


@pytest.mark.parametrize("form", list(FORMS))
def test_by_hand_attention_becomes_one_fused_call_with_the_same_values(form):
    made, got, want = _rewritten(FORMS[form], _qkv())
    assert made == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


LEFT_ALONE = {
    # the probabilities are returned, the scores reused: the fused kernel computes neither
    "probabilities-returned": lambda q, k, v: (lambda p: (p @ v, p))(torch.softmax(q @ k.transpose(-2, -1), -1)),
    "scores-reused": lambda q, k, v: (lambda s: (torch.softmax(s, -1) @ v, s.sum()))(q @ k.transpose(-2, -1)),
    # a mask, a softmax over queries, a dtype argument, k's heads and keys swapped, a tensor scale
    "masked": lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(k[..., :1, :1] > 0, -1e9), -1) @ v,
    "softmax-over-queries": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v,
    "softmax-dtype": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1, dtype=torch.float64).float() @ v,
    "k-swapped-elsewhere": lambda q, k, v: torch.softmax(q @ k.transpose(1, 2), -1) @ v,
    "tensor-scale": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / k.new_tensor(2.0), -1) @ v,
}


@pytest.mark.parametrize("form", list(LEFT_ALONE))
def test_what_the_fused_call_cannot_compute_is_left_alone(form):
    q, k, v = _qkv(h=4, s=4, l=4, d=4)
    made, got, want = _rewritten(LEFT_ALONE[form], (q, k, v))
    assert made == 0
    torch.testing.assert_close(got, want)


def test_tf32_and_unknown_policies_rewrite_nothing():
    for policy in ("tf32", "ieee"):
        made, _, _ = _rewritten(FORMS["divided"], _qkv(), policy)
        assert made == 0
    assert _rewritten(FORMS["divided"], _qkv(), "bf16")[0] == 1
