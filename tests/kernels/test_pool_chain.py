"""A pool with its pointwise neighbours as one kernel (plan.PoolChain, codegen/pool_chain.py): which
chains the plan finds, and the chain kernels against the graph's values in the Triton interpreter
(max and avg, 1, 2 and 3 pooled dims, padded and overlapping windows, ceil mode, per-channel, 0-d and
broadcast operands, channels-last inputs; fp32, tf32 and bf16 policies)."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import pool_chain
from kernelwright.codegen.triton_group import Unsupported
from kernelwright.codegen.triton_pool import TEMPLATE
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter
CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".pytest_kw_cache")


class Chain(nn.Module):
    """conv -> `pre` -> pool -> `post` (either may be None)."""

    def __init__(self, conv, pool, pre=None, post=None):
        super().__init__()
        self.conv, self.pool, self.pre, self.post = conv, pool, pre, post
        self.scale = nn.Parameter(torch.rand(conv.out_channels, *([1] * (conv.weight.dim() - 2))) + 0.5)
        self.bn = nn.BatchNorm2d(conv.out_channels)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.conv(x)
        if self.pre == "sub_hardswish":
            y = F.hardswish(y - 0.5)
        elif self.pre == "scale":
            y = y * self.scale
        elif self.pre == "bn_relu":
            y = F.relu(self.bn(y))
        y = self.pool(y)
        if self.post == "mish":
            y = F.mish(y)
        elif self.post == "bias_scale":
            y = (y + self.scale) * 2.0
        elif self.post == "sigmoid":
            y = torch.sigmoid(y)
        return y


CASES = [
    ("max2d_pre_post", lambda: Chain(nn.Conv2d(3, 5, 3), nn.MaxPool2d(2), "sub_hardswish", "mish"), (2, 3, 10, 11)),
    ("max2d_stem", lambda: Chain(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(3, 2, 1), "bn_relu"), (2, 3, 9, 9)),
    ("max2d_dilated_ceil", lambda: Chain(nn.Conv2d(3, 4, 2), nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True),
                                         "scale", "sigmoid"), (1, 3, 12, 9)),
    ("avg3d_pre_post", lambda: Chain(nn.ConvTranspose3d(3, 4, 3, stride=2), nn.AvgPool3d(2), "scale", "bias_scale"),
     (1, 3, 3, 3, 4)),
    ("avg2d_exclude_pad_ceil", lambda: Chain(nn.Conv2d(3, 4, 3), nn.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                                                count_include_pad=False),
                                             "sub_hardswish", "mish"), (2, 3, 10, 9)),
    ("avg2d_pre_only", lambda: Chain(nn.Conv2d(3, 4, 3), nn.AvgPool2d(2), "sub_hardswish"), (1, 3, 9, 10)),
    ("avg2d_post_only", lambda: Chain(nn.Conv2d(3, 4, 3, bias=False), nn.AvgPool2d(2), None, "bias_scale"), (1, 3, 9, 10)),
    # 1-D pools, captured as 2-D pools between an unsqueeze and a squeeze: the chain takes the views in
    ("max1d_pre_post", lambda: Chain(nn.Conv1d(3, 5, 3), nn.MaxPool1d(3, 2, 1), "sub_hardswish", "mish"), (2, 3, 17)),
    ("avg1d_pre_post", lambda: Chain(nn.Conv1d(3, 4, 3), nn.AvgPool1d(2), "scale", "bias_scale"), (2, 3, 16)),
]


def _chain(model, x, policy):
    g = rewrite(capture(from_module(model, [x])), policy)[0]
    plan = plan_graph(g)
    (chain,) = plan.chains
    return g, chain


def _run(g, chain, model, x, name, config=None):
    kernel = pool_chain.build(g, chain)
    pool = g.node(chain.pool)
    config = config or TEMPLATE.default(g, pool).as_dict()
    text, ins = pool_chain.render(kernel, config, name)
    mod = load_module_from_source(text, name, CACHE)
    with torch.no_grad():
        env = run_graph(g, model, [x], keep=True)
        (res,) = mod.launch(*[env[v] for v in ins])
    want = env[chain.out]
    assert res.shape == want.shape and res.dtype == want.dtype
    assert res.stride() == tuple(g.meta(chain.out).stride)
    return kernel, text, res, want


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("name,make,shape", CASES, ids=[c[0] for c in CASES])
def test_chain_matches_graph(name, make, shape, policy):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape)
    g, chain = _chain(model, x, policy)
    if policy == "fp32":  # (under bf16 the widening cast of the convolution's output is a pre group too)
        assert (chain.pre is not None) == ("post_only" not in name)
    assert (chain.post is not None) == ("pre_only" not in name)  # (the stem's ReLU moves past its max pool)
    assert bool(chain.into) == bool(chain.out_of) == ("1d" in name)  # (the unsqueezes and squeezes taken in)
    kernel, text, res, want = _run(g, chain, model, x, f"chain_{name}_{policy}")
    # the kernel reads the library's convolution output, never the group's
    assert chain.pre is None or chain.pre.outputs[0] not in kernel.inputs
    tol = 1e-2 if policy == "bf16" else 1e-5
    torch.testing.assert_close(res.float(), want.float(), rtol=tol, atol=tol)
    # per-channel operands are loaded once per output, before the window loop
    loop = text.split("for kd in")[1]
    if chain.pre is not None and "scale" in (model.pre or ""):
        assert "p_scale" in text.split("for kd in")[0]
        assert "p_scale" not in loop.split("best =")[0].split("acc +=")[0]


def test_other_configs_and_channels_last(tmp_path):
    """Smaller blocks (several programs) and a channels-last input (tf32: the plan lays the
    convolution out channels-last) give the same values."""
    torch.manual_seed(0)
    model = Chain(nn.Conv2d(4, 6, 3), nn.MaxPool2d(2), "sub_hardswish", "mish").eval()
    x = torch.randn(2, 4, 10, 10).contiguous(memory_format=torch.channels_last)
    g, chain = _chain(model, x, "tf32")
    pool = g.node(chain.pool)
    assert g.meta(pool.args[0].name).channels_last
    for cfg in TEMPLATE.space(g, pool)[:3]:
        _, _, res, want = _run(g, chain, model, x, f"chain_cl_{cfg['BLOCK']}_{cfg['num_warps']}", cfg.as_dict())
        torch.testing.assert_close(res, want, rtol=1e-5, atol=1e-5)


def test_broadcast_operand_read_through_its_strides():
    """A pre group adding a tensor broadcast over the channels ([N, 1, H, W]) reads it with a zero
    channel stride inside the window loop."""

    class M(nn.Module):
        def forward(self, x, y):
            return torch.tanh(F.max_pool2d(torch.relu(x + y), 2, 1))

    torch.manual_seed(0)
    x, y = torch.randn(2, 3, 7, 6), torch.randn(2, 1, 7, 6)
    g = rewrite(capture(from_module(M(), [x, y])), "fp32")[0]
    (chain,) = plan_graph(g).chains
    kernel = pool_chain.build(g, chain)
    text, ins = pool_chain.render(kernel, TEMPLATE.default(g, g.node(chain.pool)).as_dict(), "chain_bcast")
    mod = load_module_from_source(text, "chain_bcast", CACHE)
    (res,) = mod.launch(*[{"x": x, "y": y}[v] for v in ins])
    torch.testing.assert_close(res, M()(x, y), rtol=1e-6, atol=1e-6)
    assert "img * 42 + i_h * 6 + i_w" in text  # y: no channel term


def test_chains_the_plan_leaves_out():
    """No chain when the max pool's indices are read, when the group's result is read besides the
    pool, or when nothing pointwise touches the pool."""

    class Indices(nn.Module):
        def forward(self, x):
            v, i = F.max_pool2d(torch.relu(x), 2, return_indices=True)
            return torch.sigmoid(v), i

    class Shared(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return F.max_pool2d(y, 2), y

    class Bare(nn.Module):
        def forward(self, x):
            return F.avg_pool2d(x, 2).sum(dim=1)

    x = torch.randn(1, 2, 6, 6)
    for model in (Indices(), Shared(), Bare()):
        g = rewrite(capture(from_module(model, [x])), "fp32")[0]
        assert plan_graph(g).chains == [], type(model).__name__


def test_build_refuses_a_pool_without_channels():
    """An unbatched pool input ([C, H, W]) is not [N, C, spatial...]: the units stay apart."""

    class M(nn.Module):
        def forward(self, x):
            return torch.sigmoid(F.max_pool2d(torch.relu(x), 2))

    x = torch.randn(3, 6, 6)
    g = rewrite(capture(from_module(M(), [x])), "fp32")[0]
    (chain,) = plan_graph(g).chains
    with pytest.raises(Unsupported, match="not \\[N, C"):
        pool_chain.build(g, chain)
