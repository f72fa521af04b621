"""By-hand attention in a torch-level FX graph (what Dynamo hands a backend, before AOTAutograd) as
one `scaled_dot_product_attention` call: matmul(softmax(matmul(q, kᵀ) · c, dim=-1), v) with c a
number (a division or a multiplication; 1 where there is none; a number the graph computes from
symbolic sizes under dynamic=True too) becomes sdpa(q, k, v, scale=c).

The training backend runs this before AOTAutograd traces the joint graph, so the forward saves what
the fused kernel's backward needs (its output and log-sum-exp) instead of the [.., S, L] scores and
probabilities, and the backward runs the fused backward kernel: the inference pipeline's rewrite
(plan/attention.py) works on ATen graphs after autograd, where a training graph's backward already
reads the by-hand intermediates. Exact in real arithmetic; the policies are plan/attention.py's:
fp32 and bf16 (under bf16 autocast PyTorch runs the flash kernel on bf16 q, k, v with a float32
softmax, as torch.compile's own pattern rewrite does), not tf32 (the fused kernels have no TF32
path, and an unmasked attention there is left to cuBLAS's TF32 matmuls).

Only the plain pattern is matched: no mask, no dropout, the softmax over the last dim without a
dtype argument, q, k and v of one rank (at least 3) with equal batch dims, and every intermediate
read by the next step alone (a model that returns or reuses its scores or probabilities keeps its
by-hand form).
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

POLICIES = ("fp32", "bf16")
_MATMUL = (torch.matmul, operator.matmul)
_SOFTMAX = (torch.softmax, F.softmax)
_SCALE = {operator.truediv: "div", torch.div: "div", operator.mul: "mul", torch.mul: "mul"}


def _value(node):
    """The example tensor Dynamo recorded for `node` (None if it has none)."""
    v = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _calls(node, functions, method: str | None = None) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    return (node.op == "call_function" and node.target in functions) or (node.op == "call_method" and node.target == method)


def _only_user(node, user) -> bool:
    return list(node.users) == [user]


def _softmax_input(node):
    """The input of a softmax over the last dim (no dtype), else None."""
    if not _calls(node, _SOFTMAX, "softmax") or node.kwargs.get("dtype") is not None or len(node.args) > 2:
        return None
    x = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    v = _value(x)
    if v is None or not isinstance(dim, int) or dim not in (-1, v.dim() - 1):
        return None
    return x


def _swapped(node):
    """k where `node` is k with its last two dims swapped (transpose / swapaxes / mT), else None."""
    if not isinstance(node, torch.fx.Node):
        return None
    v = _value(node)
    if v is None:
        return None
    last = {-1, -2, v.dim() - 1, v.dim() - 2}
    if _calls(node, (torch.transpose, torch.swapaxes), "transpose") or _calls(node, (), "swapaxes"):
        dims = list(node.args[1:]) or [node.kwargs.get("dim0"), node.kwargs.get("dim1")]
        if len(dims) == 2 and all(isinstance(d, int) for d in dims) and set(dims) <= last \
                and dims[0] % v.dim() != dims[1] % v.dim():
            return node.args[0]
    if node.op == "call_function" and node.target is getattr and node.args[1] == "mT":
        return node.args[0]
    return None


def _number(c) -> bool:
    """A nonzero Python number, or a graph value that is a number (computed from symbolic sizes)."""
    if isinstance(c, torch.fx.Node):
        v = c.meta.get("example_value")
        return isinstance(v, (torch.SymInt, torch.SymFloat, int, float)) and not isinstance(v, bool)
    return isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0


def _match(out):
    """(q, k, v, scale, [nodes replaced, last first]) where `out` ends a by-hand attention, else None."""
    if not _calls(out, _MATMUL) or len(out.args) != 2 or out.kwargs:
        return None
    probs, v = out.args
    scores = _softmax_input(probs)
    if scores is None or not _only_user(probs, out):
        return None
    nodes, scale = [out, probs], 1.0  # (SDPA's own default is 1 / sqrt(d): always given)
    if _calls(scores, tuple(_SCALE)) and len(scores.args) == 2 and _number(scores.args[1]) and not scores.kwargs:
        c = scores.args[1]
        if isinstance(c, torch.fx.Node):  # (a value of the sizes, e.g. head_dim ** 0.5 under dynamic=True)
            scale = (c, _SCALE[scores.target])
        else:
            scale = 1.0 / float(c) if _SCALE[scores.target] == "div" else float(c)
        if not _only_user(scores, probs):
            return None
        nodes.append(scores)
        scores = scores.args[0]
    if not _calls(scores, _MATMUL) or len(scores.args) != 2 or not _only_user(scores, nodes[-1]):
        return None
    q, kt = scores.args
    k = _swapped(kt)
    nodes.append(scores)
    tq, tk, tv = _value(q), _value(k), _value(v)
    if k is None or tq is None or tk is None or tv is None or tq.dim() < 3 or not tq.dim() == tk.dim() == tv.dim():
        return None
    if not (tq.shape[:-2] == tk.shape[:-2] == tv.shape[:-2] and tq.shape[-1] == tk.shape[-1]
            and tk.shape[-2] == tv.shape[-2] and all(t.dtype.is_floating_point for t in (tq, tk, tv))):
        return None
    return q, k, v, scale, nodes


def sdpa_in_fx(gm: torch.fx.GraphModule, policy: str) -> int:
    """Rewrite every plain by-hand attention of `gm` (in place) as one scaled_dot_product_attention
    call under the policies of POLICIES; returns how many were rewritten."""
    if policy not in POLICIES:
        return 0
    done = 0
    for node in list(gm.graph.nodes):
        hit = _match(node)
        if hit is None:
            continue
        q, k, v, scale, nodes = hit
        with gm.graph.inserting_before(node):
            if isinstance(scale, tuple):  # (a number the graph computes: divided by it, or times it)
                c, how = scale
                scale = gm.graph.call_function(operator.truediv, (1.0, c)) if how == "div" else c
            new = gm.graph.call_function(F.scaled_dot_product_attention, (q, k, v), {"scale": scale})
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        kt = nodes[-1].args[1]
        for n in nodes:  # (last first: each one's only reader is gone before it)
            gm.graph.erase_node(n)
        if not kt.users:  # (k's swap, read by the scores alone; nothing else is dropped)
            gm.graph.erase_node(kt)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


__all__ = ["POLICIES", "sdpa_in_fx"]
