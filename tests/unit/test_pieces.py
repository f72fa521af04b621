"""Elementwise work over a concatenation done per piece (plan/pieces.py): exact, and the joined
value's pieces are what the concatenation joins."""
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan import plan_graph
from kernelwright.plan.pieces import CAT, MAX_PIECES, compute_by_pieces
from kernelwright.problem import from_module


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rope(nn.Module):
    """Rotary embedding of [batch, heads, seq, dim] queries; cos / sin tables [seq, dim] as buffers."""

    def __init__(self, seq=8, dim=8):
        super().__init__()
        freqs = torch.outer(torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q):
        return q * self.cos + rotate_half(q) * self.sin


def _rewritten(model, *inputs):
    g = capture(from_module(model, list(inputs)))
    r, notes = compute_by_pieces(g)
    with torch.no_grad():
        got, want = run_graph(r, model, list(inputs)), model(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))  # bit for bit
    return g, r, notes


def test_a_rotary_embedding_is_two_elementwise_halves_joined():
    g, r, notes = _rewritten(Rope(), torch.randn(2, 3, 8, 8))
    assert notes
    out = r.node(r.outputs[0])
    assert out.target == CAT and len(out.args[0]) == 2  # the result joins the two halves
    for half in out.args[0]:
        assert r.meta(half.name).shape == (2, 3, 8, 4)
    # nothing else is joined: no copy of a half of q into a joined tensor is left
    assert [n.name for n in r.nodes if n.target == CAT] == [out.name]
    # each half is one elementwise group written into its slice of the result
    plan = plan_graph(r)
    assert len(plan.groups) == 2 and all(g.rdims is None for g in plan.groups)


class RopeHeads(Rope):
    """The rotary embedding of heads taken from a [batch, seq, heads, dim] projection and put back
    with a view: the embedding's result has the projection's (permuted) layout, which the view needs."""

    def forward(self, x):
        q = x.transpose(1, 2)
        return super().forward(q).transpose(1, 2).view(x.shape[0], x.shape[1], -1)


def test_the_joined_result_keeps_the_layout_of_the_value_it_replaces():
    g, r, notes = _rewritten(RopeHeads(), torch.randn(2, 8, 3, 8))  # (the view would fail on a contiguous cat)
    cat = next(n for n in r.nodes if n.target == CAT)
    assert notes and cat.meta.stride == g.node(cat.name).meta.stride != (192, 64, 8, 1)


class Joined(nn.Module):
    def __init__(self, pieces=2, twice=False, broadcast=False):
        super().__init__()
        self.pieces, self.twice, self.broadcast = pieces, twice, broadcast

    def forward(self, x, y):
        c = torch.cat([x * (k + 1) for k in range(self.pieces)], dim=1)
        z = torch.sigmoid(c) + (y[:, :1] if self.broadcast else y)
        return (z, c) if self.twice else z


def test_operands_are_sliced_beside_each_piece_or_broadcast():
    x = torch.randn(2, 3)
    for broadcast in (False, True):
        _, r, notes = _rewritten(Joined(broadcast=broadcast), x, torch.randn(2, 6))
        assert any("per piece" in n for n in notes)
        assert r.node(r.outputs[0]).target == CAT
        slices = [n for n in r.nodes if n.target == "aten.slice.Tensor" and n.meta.shape == (2, 3)
                  and n.args[0].name == "y"]
        assert len(slices) == (0 if broadcast else 2)  # y's halves, or y[:, :1] as it is


def test_a_concatenation_read_elsewhere_or_of_many_pieces_stays():
    x, y = torch.randn(2, 3), torch.randn(2, 3 * (MAX_PIECES + 1))
    g, r, notes = _rewritten(Joined(pieces=MAX_PIECES + 1), x, y)
    assert notes == [] and r is g
    g, r, notes = _rewritten(Joined(twice=True), x, torch.randn(2, 6))  # the joined value is returned too
    assert notes == [] and r is g


class Sliced(nn.Module):
    def forward(self, x, w):
        h = torch.tanh(x) * w
        return h[:, :4] + 1, h[:, 4:] * 2


def test_an_elementwise_value_read_only_through_slices_is_computed_per_slice():
    _, r, notes = _rewritten(Sliced(), torch.randn(3, 8), torch.randn(8))
    assert sum("slices of" in n for n in notes) == 4  # the product's two slices, then the tanh's
    assert not any(n.meta.shape == (3, 8) for n in r.nodes if n.target in ("aten.mul.Tensor", "aten.tanh.default"))
