"""By-hand attention becomes one scaled_dot_product_attention call (plan/attention.py), and bf16
values reach the next GEMM without a float32 round trip (rewrites.narrow_through_views)."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.execute import fixed_layout, layout_suffix, run_graph
from kernelwright.emit.program import node_line
from kernelwright.plan.attention import SDPA, attention
from kernelwright.plan.rewrites import narrow_through_views, rewrite
from kernelwright.problem import from_module, load_problem

ROOT = Path(__file__).resolve().parents[2] / "problems"


class Heads(nn.Module):
    """q, k, v heads of one projection; scores scaled by a division, optionally returned too."""

    def __init__(self, d=32, h=4, return_scores=False):
        super().__init__()
        self.h, self.return_scores = h, return_scores
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.h, d // self.h).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.h)
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, d)
        return (out, scores) if self.return_scores else out


class Plain(nn.Module):
    """3-D attention (no heads), the scale as a multiplication, the result returned as is."""

    def forward(self, q, k, v):
        return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, dim=-1), v)


def _targets(g):
    return [n.target for n in g.nodes]


def test_heads_attention_is_one_sdpa_call_with_the_same_values():
    torch.manual_seed(0)
    model, x = Heads().eval(), torch.randn(2, 8, 32)
    g = capture(from_module(model, [x]))
    r, notes = rewrite(g, "fp32")
    assert _targets(r).count(SDPA) == 1 and "aten.bmm.default" not in _targets(r)
    assert "aten._softmax.default" not in _targets(r)
    assert any("scaled_dot_product_attention" in n for n in notes)
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    assert sdpa.kwargs["scale"] == pytest.approx(1 / math.sqrt(8))
    assert sdpa.meta.stride == (256, 8, 32, 1)  # [b, h, s, d] stored [b, s, h, d]
    # the transpose(1, 2).reshape after it became a free view (the copy is gone)
    assert "aten.clone.default" not in _targets(r)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(r, model, [x])[0], model(x), rtol=1e-5, atol=1e-6)


def test_no_rewrite_when_the_scores_are_read():
    scored, x = Heads(return_scores=True), torch.randn(2, 8, 32)
    g2 = capture(from_module(scored, [x]))
    r, notes = attention(g2)
    assert r is g2 and notes == []


def test_three_dim_attention_with_a_multiplied_scale():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 6)
    g = capture(from_module(Plain(), [q, k, v]))
    r, notes = attention(g)
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    assert sdpa.kwargs["scale"] == 0.25 and sdpa.meta.shape == (3, 5, 6) and sdpa.meta.stride == (30, 6, 1)
    torch.testing.assert_close(run_graph(r, Plain(), [q, k, v])[0], Plain()(q, k, v), rtol=1e-5, atol=1e-6)


def test_emitted_layout_fix_matches_the_reference_run():
    t = torch.randn(2, 3, 5, 4)  # as the math fallback returns it: contiguous [b, h, s, d]
    fixed = fixed_layout(SDPA, t)
    assert torch.equal(fixed, t) and fixed.stride() == (60, 4, 12, 1)
    emitted = eval("t" + layout_suffix(SDPA, 4))
    assert emitted.stride() == fixed.stride()
    assert fixed_layout(SDPA, fixed).data_ptr() == fixed.data_ptr()  # already so: no copy
    assert layout_suffix("aten.bmm.default", 3) == ""
    r, _ = rewrite(capture(from_module(Heads(), [torch.randn(2, 8, 32)])), "fp32")
    line = node_line(r, next(n.name for n in r.nodes if n.target == SDPA))
    assert line.endswith(layout_suffix(SDPA, 4)) and "scale=" in line


def test_bf16_attention_reads_views_of_the_bf16_projection():
    torch.manual_seed(2)
    prob = load_problem(ROOT / "level3" / "transformer_block.py", small=True)
    g = capture(prob)
    r, notes = rewrite(g, "bf16")
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    assert sdpa.meta.dtype == "bfloat16"
    # q, k, v are views of the bf16 qkv GEMM: no float32 copy of it, no casts back
    for a in sdpa.args[:3]:
        node = r.node(a.name)
        assert node.target == "aten.permute.default" and node.meta.dtype == "bfloat16"
    assert any("no float32 round trip" in n for n in notes)
    qkv = next(n for n in r.nodes if n.target == "aten.addmm.default")
    assert all(u.target != "aten._to_copy.default" for u in r.users(qkv.name))
    model, inputs = prob.make_model("cpu"), prob.make_inputs(0, "cpu")
    with torch.no_grad():
        out = run_graph(r, model, inputs)[0]
        ref = model(*inputs)
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)


def test_narrowing_is_exact():
    """widen -> views -> narrow is the views of the bf16 value, bit for bit."""

    class M(nn.Module):
        def forward(self, a, b, c):
            return torch.mm(torch.mm(a, b).t(), c)

    a, b, c = torch.randn(6, 5), torch.randn(5, 4), torch.randn(6, 3)
    g = capture(from_module(M(), [a, b, c]))
    low, notes = rewrite(g, "bf16")
    assert any("no float32 round trip" in n for n in notes)
    first = next(n for n in low.nodes if n.target == "aten.mm.default")
    assert [u.target for u in low.users(first.name)] == ["aten.permute.default"]  # no widening cast
    with torch.no_grad():
        out = run_graph(low, M(), [a, b, c])[0]
    bf = torch.bfloat16
    assert torch.equal(out, torch.mm(torch.mm(a.to(bf), b.to(bf)).t(), c.to(bf)).float())
    again, more = narrow_through_views(low)
    assert again is low and more == []  # nothing left to narrow


def test_bf16_copies_move_bf16_values():
    """Under bf16 a copy between a value and its narrowing cast moves bf16: the attention result
    (bf16) transposed and made contiguous for the output projection is copied in bf16 (no widening
    and no cast back), and the grouped-query keys (float32, after the rotary embedding) are narrowed
    before they are repeated for every head, so no float32 copy is left in the graph."""
    torch.manual_seed(3)
    prob = load_problem(ROOT / "level3" / "llama_block.py", small=True)
    g = capture(prob)
    r, notes = rewrite(g, "bf16")
    assert any("narrowed before its copies" in n for n in notes)
    assert sum("no float32 round trip" in n for n in notes) >= 2  # the values and the attention result
    clones = [n for n in r.nodes if n.target == "aten.clone.default"]
    assert len(clones) == 3 and all(n.meta.dtype == "bfloat16" for n in clones)
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    assert [u.target for u in r.users(sdpa.name)] == ["aten.permute.default"]  # no widening cast
    model, inputs = prob.make_model("cpu"), prob.make_inputs(0, "cpu")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(*inputs)
    with torch.no_grad():
        out = run_graph(r, model, inputs)[0]
    torch.testing.assert_close(out, ref.float(), rtol=5e-2, atol=5e-2)


class PackedHeads(nn.Module):
    """nn.MultiheadAttention: one packed in-projection, q, k and v selected from its contiguous copy."""

    def __init__(self, d=32, h=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def test_bf16_packed_projection_is_narrowed_before_its_copy():
    """Under bf16 the packed projection's result (bias added in float32) is narrowed once, before
    the copy q, k and v are selected from, where every use of it ends in a cast to bf16: the copy
    moves bf16 and no per-head casts are left."""
    torch.manual_seed(4)
    model, x = PackedHeads().eval(), torch.randn(2, 8, 32)
    r, notes = rewrite(capture(from_module(model, [x])), "bf16")
    assert any("narrowed before its copies" in n for n in notes)
    clones = [n for n in r.nodes if n.target == "aten.clone.default"]
    assert clones and all(n.meta.dtype == "bfloat16" for n in clones)
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    for a in sdpa.args[:3]:
        assert r.node(a.name).target != "aten._to_copy.default"  # a view of the bf16 copy, not a cast
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
    with torch.no_grad():
        out = run_graph(r, model, [x])[0]
    torch.testing.assert_close(out, ref.float(), rtol=5e-2, atol=5e-2)


class Causal(nn.Module):
    """minGPT's causal self-attention: scores masked by a lower-triangular buffer, dropout p=0."""

    def __init__(self, d=32, h=4, max_len=16, fill=float("-inf")):
        super().__init__()
        self.h, self.fill = h, fill
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.drop = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, self.fill)
        y = self.drop(torch.softmax(att, dim=-1)) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def test_causal_mask_becomes_the_attn_mask():
    torch.manual_seed(3)
    model, x = Causal(), torch.randn(2, 8, 32)
    g = capture(from_module(model, [x]))
    r, notes = rewrite(g, "fp32")
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    keep = r.node(sdpa.args[3].name)  # SDPA's mask: True where a score takes part
    assert keep.target == "aten.logical_not.default" and keep.meta.dtype == "bool"
    assert "aten._softmax.default" not in _targets(r) and any("attn_mask" in n for n in notes)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(r, model, [x])[0], model(x), rtol=1e-5, atol=1e-6)
    # a finite fill is not -inf: softmax differs from a mask (slightly), no rewrite
    finite = Causal(fill=-1e9)
    assert SDPA not in _targets(rewrite(capture(from_module(finite, [x])), "fp32")[0])


def _optimised_causal(policy: str, tmp_path):
    """(model, input, problem, optimize's result) of `Causal` optimised on the CPU under `policy`
    into tmp_path/out, verified."""
    from kernelwright.pipeline import Options, optimize_problem

    torch.manual_seed(4)
    model, x = Causal(), torch.randn(2, 8, 32)
    prob = from_module(model, [x], name="causal")
    result = optimize_problem(prob, tmp_path / "out", Options(device="cpu", budget_trials=1, precision=policy,
                                                               db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    return model, x, prob, result


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
def test_causal_attention_end_to_end(policy, tmp_path, monkeypatch):
    """Where PyTorch's SDPA is the choice (the generated attention kernel left out here), optimize
    emits a module that calls it with is_causal=True while the registered mask is the
    lower-triangular one, checked once per buffer version: changed in place, the mask is used."""
    from kernelwright.codegen import node_kernels
    from kernelwright.emit.module import import_model_new, model_new_like

    every = node_kernels.templates
    monkeypatch.setattr(node_kernels, "templates", lambda: [t for t in every() if t.name != "triton.attention"])
    model, x, prob, _ = _optimised_causal(policy, tmp_path)
    path = tmp_path / "out" / "model_new.py"
    text = path.read_text()
    assert "scaled_dot_product_attention" in text and "logical_not" in text and "*_rt.causal_or_mask(" in text
    mod = import_model_new(path)
    new = model_new_like(mod, prob, model, "cpu")
    seen = []
    check = mod._rt.causal_or_mask
    mod._rt.causal_or_mask = lambda *a: seen.append(check(*a)) or seen[-1]
    tol = dict(rtol=3e-2, atol=3e-2) if policy == "bf16" else dict(rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(new(x).float(), model(x), **tol)
        assert [s[0] is None and s[2] for s in seen] == [True, True]  # causal: no mask tensor
        model.bias[..., 0, 1] = 1.0  # the first query now sees the second key too
        new.bias[..., 0, 1] = 1.0
        torch.testing.assert_close(new(x).float(), model(x), **tol)
        assert seen[-1][2] is False and seen[-1][0].dtype == torch.bool


def test_causal_check_once_per_version(tmp_path):
    """The runtime's helper compares the mask with the causal one once per tensor and version."""
    from kernelwright.emit.module import import_model_new, render_model_new, write_module

    prob = from_module(Plain(), [torch.randn(1, 4, 8)] * 3, name="plain")
    mod = import_model_new(write_module(tmp_path, render_model_new(prob, [], "fp32", None), {}))._rt
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4)
    keep = torch.ones(5, 6, dtype=torch.bool).tril()
    assert mod.causal_or_mask(keep, q, k, 0.0) == (None, 0.0, True)
    calls = []
    real = torch.equal
    torch.equal = lambda *a: calls.append(1) or real(*a)
    try:
        assert mod.causal_or_mask(keep, q, k, 0.0)[2] and calls == []  # cached
        keep[0, 1] = True  # in place: the version moves
        m, p, causal = mod.causal_or_mask(keep, q, k, 0.0)
        assert m is keep and not causal and calls == [1]
    finally:
        torch.equal = real
    wrong_len = torch.ones(5, 5, dtype=torch.bool).tril()  # not [L, S]: never is_causal
    assert mod.causal_or_mask(wrong_len, q, k, 0.0)[0] is wrong_len


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
def test_every_policy_rewrites_masked_and_unmasked_attention(policy):
    """Under tf32 too (the generated kernel's TF32 dots): causal and unmasked attention alike; an
    unknown policy name rewrites nothing."""
    torch.manual_seed(6)
    x = torch.randn(2, 8, 32)
    assert SDPA in _targets(rewrite(capture(from_module(Causal(), [x])), policy)[0])
    assert SDPA in _targets(rewrite(capture(from_module(Heads(), [x])), policy)[0])
    assert SDPA not in _targets(attention(capture(from_module(Heads(), [x])), "fp16")[0])


class Cross(nn.Module):
    """Cross-attention: queries from x (5 positions), keys and values from y (7 positions)."""

    def __init__(self, d=16, h=2):
        super().__init__()
        self.h, self.q, self.kv = h, nn.Linear(d, d), nn.Linear(d, 2 * d)

    def forward(self, x, y):
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.h, d // self.h).transpose(1, 2)
        k, v = (t.view(b, y.shape[1], self.h, d // self.h).transpose(1, 2) for t in self.kv(y).split(d, -1))
        att = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_cross_attention_with_different_lengths(policy):
    torch.manual_seed(5)
    model, x, y = Cross(), torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    g = capture(from_module(model, [x, y]))
    r, _ = rewrite(g, policy)
    sdpa = next(n for n in r.nodes if n.target == SDPA)
    assert sdpa.meta.shape == (3, 2, 5, 8) and sdpa.kwargs["scale"] == 0.5
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=policy == "bf16"):
        ref = model(x, y)
    with torch.no_grad():
        out = run_graph(r, model, [x, y])[0]
    tol = 1e-5 if policy == "fp32" else 3e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def test_buffers_the_forward_writes_are_not_weights():
    """weight_roots: a registered mask counts as a weight (its transforms are cached per version),
    batch norm's running statistics, which the training forward updates, do not."""
    from kernelwright.plan.weights import weight_roots

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.register_buffer("scale", torch.full((4,), 2.0))

        def forward(self, x):
            return self.bn(x) * (self.scale + 1)

    g = capture(from_module(M().train(), [torch.randn(3, 4)]))
    roots = weight_roots(g)
    buffers = {i.fqn: i.name for i in g.inputs if i.kind == "buffer"}
    assert buffers["scale"] in roots and buffers["bn.running_mean"] not in roots
    assert any(roots.get(n.name) == (buffers["scale"],) for n in g.nodes)  # scale + 1


@pytest.mark.parametrize("policy", ["tf32"])
def test_causal_attention_through_the_generated_kernel(policy, tmp_path):
    """Where the generated attention kernel is the choice (untimed on the CPU: the template's),
    the emitted forward launches it on the projection's views with the registered mask, and
    follows the mask when it changes in place (the kernel reads it at every call)."""
    from kernelwright.emit.module import import_model_new, model_new_like

    model, x, prob, result = _optimised_causal(policy, tmp_path)
    assert any(g["kind"] == "node" and g["ops"] == ["scaled_dot_product_attention"] and g["strategy"] == "triton"
               for g in result["groups"])
    new = model_new_like(import_model_new(tmp_path / "out" / "model_new.py"), prob, model, "cpu")
    with torch.no_grad():
        torch.testing.assert_close(new(x), model(x), rtol=1e-5, atol=1e-5)
        model.bias[..., 0, 1] = 1.0  # the first query now sees the second key too
        new.bias[..., 0, 1] = 1.0
        torch.testing.assert_close(new(x), model(x), rtol=1e-5, atol=1e-5)
