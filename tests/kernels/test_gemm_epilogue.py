"""GEMM + epilogue fusion (codegen/gemm_epilogue.py): which groups reading a GEMM's result fold into one
Triton GEMM (pointwise epilogues, row reductions, softmax, whole-row norms, logsumexp), the views and
strides its operands are read through, and the fused kernels run in the Triton interpreter against the
graph's values."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import gemm_epilogue
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module, load_problem

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gemm_epilogue_reads_and_writes_views_of_another_rank():
    """transformer_block's fc2 GEMM ([B*T, C]) with the residual add of x ([B, T, C]) and the
    result viewed [B, T, C]: the fused GEMM reads x row-major as [M, N] and returns the 3-D view
    (both failed as data before: a shape mismatch, an expand of the 3-D operand). Under bf16,
    where the GEMM's widened result is its own group's input."""
    from kernelwright.plan.rewrites import rewrite

    policy = "bf16"
    p = load_problem(os.path.join(ROOT, "problems", "level3", "transformer_block.py"), small=True)
    g = rewrite(capture(p), policy)[0]
    plan = plan_graph(g)
    with torch.no_grad():
        env = run_graph(g, p.make_model(), p.make_inputs(3), keep=True)
    found = 0
    for group in plan.groups:
        for v in group.inputs:
            gemm = None if g.is_input(v) else g.node(v)
            if gemm is None or gemm.target not in gemm_epilogue.GEMMS or gemm_epilogue.fusable(g, gemm, group):
                continue
            out = g.meta(group.outputs[0])
            if len(out.shape) == 2:
                continue
            fused = gemm_epilogue.build(g, gemm, group, plan.groups)
            assert fused.out_shape == tuple(out.shape) and fused.flat
            cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "num_warps": 4,
                   "num_stages": 1}
            text, ins = gemm_epilogue.render(fused, cfg, policy)
            mod = load_module_from_source(text, f"{group.id}_{policy}_view", os.path.join(ROOT, ".pytest_kw_cache"))
            (res,) = mod.launch(*[env[i] for i in ins])
            want = env[group.outputs[0]]
            assert res.shape == want.shape and res.dtype == want.dtype
            torch.testing.assert_close(res.float(), want.float(), rtol=2e-2, atol=2e-2)
            found += 1
    assert found == 1


def _gemm_groups(g, plan):
    """(library GEMM node, group reading its output) pairs of a plan."""
    return [(g.node(v), grp) for grp in plan.groups for v in grp.inputs
            if not g.is_input(v) and g.node(v).target in gemm_epilogue.GEMMS]


def _fused_linear(model, x, policy):
    """The one (GEMM, epilogue group) pair of `model` captured on `x` (a tensor or a list of
    them) under `policy`, fusable, with its GemmEpilogue: (graph, group, fused)."""
    from kernelwright.plan.rewrites import rewrite

    g = rewrite(capture(from_module(model, x if isinstance(x, list) else [x])), policy)[0]
    plan = plan_graph(g)
    ((gemm, group),) = _gemm_groups(g, plan)
    assert gemm_epilogue.fusable(g, gemm, group) is None
    return g, group, gemm_epilogue.build(g, gemm, group, plan.groups)


def _assert_fused_matches(g, model, x, group, text, ins, name, tol):
    """The fused kernel module `text` (interpreter) gives the group's output as the graph does."""
    with torch.no_grad():
        env = run_graph(g, model, x if isinstance(x, list) else [x], keep=True)
    mod = load_module_from_source(text, name, os.path.join(ROOT, ".pytest_kw_cache"))
    (out,) = mod.launch(*[env[v] for v in ins])
    want = env[group.outputs[0]]
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_gemm_with_its_row_reduction_folded_in(policy):
    """Strategy 3: gemm_sigmoid_sum's Linear -> sigmoid -> sum(dim=1, keepdim) as one Triton GEMM
    that sums each row's tiles as it goes (the [M, N] product is never written), returning the
    [M, 1] view; under bf16 it reads the float32 activation and rounds its tiles itself. The
    shrunk layer / group norm problems become whole-row ("tile") GEMMs, logsumexp its own mode."""
    from kernelwright.plan.rewrites import rewrite

    def pairs(name):
        p = load_problem(os.path.join(ROOT, "problems", "level2", name), small=True)
        g = rewrite(capture(p), policy)[0]
        plan = plan_graph(g)
        return p, g, plan, _gemm_groups(g, plan)

    p, g, plan, found = pairs("gemm_sigmoid_sum.py")
    ((gemm, group),) = found
    assert gemm_epilogue.fusable(g, gemm, group) is None
    fused = gemm_epilogue.build(g, gemm, group, plan.groups)
    assert fused.reduce == "sum" and fused.out_shape == tuple(g.meta(group.outputs[0]).shape)
    assert fused.a == "x" and bool(fused.prologue) == (policy == "bf16")  # the cast of x absorbed under bf16
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}
    text, ins = gemm_epilogue.render(fused, cfg, policy)
    assert "reduce='sum'" in text
    with torch.no_grad():
        env = run_graph(g, p.make_model(), p.make_inputs(4), keep=True)
    mod = load_module_from_source(text, f"rowreduce_{policy}", os.path.join(ROOT, ".pytest_kw_cache"))
    (out,) = mod.launch(*[env[v] for v in ins])
    want = env[group.outputs[0]]
    assert out.shape == want.shape and out.dtype == want.dtype
    tol = 1e-5 if policy == "fp32" else 1e-2  # (bf16: the library sums the GEMM's bf16-rounded output)
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    # layer / group norm run statement by statement on the whole row (test_gemm_with_a_norm_on_whole_rows)
    for name in ("gemm_layer_norm.py", "gemm_group_norm_swish.py"):
        _, g2, plan2, found2 = pairs(name)
        ((gm, grp),) = [(gm, grp) for gm, grp in found2 if gemm_epilogue.fusable(g2, gm, grp) is None]
        assert gemm_epilogue.build(g2, gm, grp, plan2.groups).reduce == "tile"
    _, g3, plan3, ((gm, grp),) = pairs("gemm_logsumexp.py")
    assert gemm_epilogue.build(g3, gm, grp, plan3.groups).reduce == "logsumexp"


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("op,reduce", [
    ("softmax", "softmax"), ("log_softmax", "log_softmax"), ("mean", "sum"), ("norm", "sum"), ("amax", "max"),
    ("logsumexp", "logsumexp"),
])
def test_gemm_with_a_softmax_mean_or_norm_folded_in(policy, op, reduce):
    """Strategy 3 beyond sum / max / min: a Linear whose row (N <= 256) ends in a softmax or
    log-softmax becomes one GEMM writing the normalized rows; a mean, a vector norm or an amax
    followed by per-row arithmetic keeps that arithmetic as row code after the reduction; the
    kernel (interpreter) matches eager."""
    fns = {"softmax": lambda y: torch.softmax(y, 1), "log_softmax": lambda y: F.log_softmax(y, 1),
           "mean": lambda y: torch.sigmoid(y).mean(1), "norm": lambda y: torch.linalg.vector_norm(y, dim=1),
           "amax": lambda y: torch.tanh(y).amax(1) * 2 + 1, "logsumexp": lambda y: torch.logsumexp(y, 1)}

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(32, 24)

        def forward(self, x):
            return fns[op](self.l(x))

    torch.manual_seed(0)
    model, x = M(), torch.randn(20, 32)
    g, group, fused = _fused_linear(model, x, policy)
    assert fused.reduce == reduce and bool(fused.row_code) == (reduce == "sum" or op == "amax")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}
    text, ins = gemm_epilogue.render(fused, cfg, policy)
    _assert_fused_matches(g, model, x, group, text, ins, f"rowop_{op}_{policy}", 1e-5 if policy == "fp32" else 2e-2)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("op,reduce", [
    ("layer_norm", "tile"), ("layer_norm_relu", "tile"), ("group_norm_silu", "tile"), ("var", "tile_row"),
    ("rms", "tile"),
])
def test_gemm_with_a_norm_on_whole_rows(policy, op, reduce):
    """Strategy 3 for any other row reduction of rows of N <= 256: a layer norm (then more
    pointwise work), a group norm (each row viewed as [G, N / G] segments), a row variance and a
    hand-written RMS norm run statement by statement on the tile that holds whole rows; the
    kernel (interpreter) matches eager, with rows masked at the edge (M = 20, BLOCK_M = 16) and a
    row narrower than the tile (N = 24 in a 32-column tile) where there are no segments."""
    n = 32 if op == "group_norm_silu" else 24
    fns = {"layer_norm": lambda m, y: m.ln(y), "layer_norm_relu": lambda m, y: torch.relu(m.ln(y)) * 0.5,
           "group_norm_silu": lambda m, y: F.silu(m.gn(y)), "var": lambda m, y: y.var(1),
           "rms": lambda m, y: y * torch.rsqrt(y.pow(2).mean(1, keepdim=True) + 1e-6)}

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.ln, self.gn = nn.Linear(40, n), nn.LayerNorm(n), nn.GroupNorm(4, n)
            nn.init.normal_(self.ln.weight)
            nn.init.normal_(self.gn.bias)

        def forward(self, x):
            return fns[op](self, self.l(x))

    torch.manual_seed(0)
    model, x = M(), torch.randn(20, 40)
    g, group, fused = _fused_linear(model, x, policy)
    assert fused.reduce == reduce
    assert ("tl.reshape(acc, (BLOCK_M, 4, 8))" in fused.epilogue.code) == (op == "group_norm_silu")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}
    text, ins = gemm_epilogue.render(fused, cfg, policy)
    assert "BLOCK_N=32" in text  # the whole row's tile, whatever the config said
    # (bf16: the library normalizes the GEMM's bf16-rounded output)
    _assert_fused_matches(g, model, x, group, text, ins, f"rownorm_{op}_{policy}", 2e-5 if policy == "fp32" else 5e-2)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_whole_row_epilogues_read_row_operands_and_scaled_addmm(policy):
    """A whole-row epilogue with a per-row operand in the segmented [BLOCK_M, G, S] view (group
    norm times a [M, 1] input), and a layer norm after addmm(beta=0.5, alpha=2)."""
    class GroupNormRow(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.gn = nn.Linear(40, 32), nn.GroupNorm(4, 32)

        def forward(self, x, r):
            return self.gn(self.l(x)) * r

    class ScaledAddmm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(40, 32)), nn.Parameter(torch.randn(32))

        def forward(self, x):
            return F.layer_norm(torch.addmm(self.b, x, self.w, beta=0.5, alpha=2.0), (32,))

    torch.manual_seed(0)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4}
    tol = 2e-5 if policy == "fp32" else 5e-2
    for model, x, kinds in ((GroupNormRow(), [torch.randn(20, 40), torch.randn(20, 1)], {"row", "col"}),
                            (ScaledAddmm(), [torch.randn(20, 40)], {"col"})):
        g, group, fused = _fused_linear(model, x, policy)
        assert fused.reduce == "tile" and {o.kind for o in fused.epilogue.operands} == kinds
        text, ins = gemm_epilogue.render(fused, cfg, policy)
        _assert_fused_matches(g, model, x, group, text, ins, f"wholerow_{type(model).__name__}_{policy}", tol)


def test_row_segments_and_matrix_strides():
    """Which reductions over a GEMM's [M, N] output are row (segment) reductions, and operand
    strides over such a group's domain read back as [M, N] strides (or refused)."""
    from types import SimpleNamespace as NS

    seg = gemm_epilogue.row_segments
    assert seg(NS(domain=(8, 16), rdims=(1,)), 8, 16) == (1, 16)  # layer norm, row sum
    assert seg(NS(domain=(8, 4, 4, 1), rdims=(2, 3)), 8, 16) == (4, 4)  # group norm: 4 segments of 4
    assert seg(NS(domain=(8, 16), rdims=(0,)), 8, 16) is None  # over the rows (batch norm)
    assert seg(NS(domain=(8, 4, 4), rdims=(1,)), 8, 16) is None  # not a trailing block of dims
    assert seg(NS(domain=(4, 32), rdims=(1,)), 8, 16) is None  # another shape
    ms = gemm_epilogue._matrix_strides
    D = (8, 4, 4, 1)
    assert ms((16, 4, 1, 0), D, 16) == (16, 1)  # the GEMM output itself
    assert ms((0, 4, 1, 0), D, 16) == (0, 1)  # a per-feature weight
    assert ms((1, 0, 0, 0), D, 16) == (1, 0)  # one value per row
    with pytest.raises(gemm_epilogue.Unsupported, match="not a \\[M, N\\] matrix"):
        ms((16, 1, 0, 0), D, 16)  # one value per segment
    assert ms((5, 7), (8, 16), 16) == (5, 7)  # a 2-D domain is the matrix


def test_segmented_rows_need_powers_of_two():
    """A group norm whose segments are not a power of two wide (3 groups of 8) stays with the
    library path, with both reasons given."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.gn = nn.Linear(8, 24), nn.GroupNorm(3, 24)

        def forward(self, x):
            return self.gn(self.l(x))

    g = capture(from_module(M(), [torch.randn(4, 8)]))
    plan = plan_graph(g)
    ((gemm, group),) = _gemm_groups(g, plan)
    assert gemm_epilogue.fusable(g, gemm, group) is None
    with pytest.raises(gemm_epilogue.Unsupported, match="segments of each row.*powers of two"):
        gemm_epilogue.build(g, gemm, group, plan.groups)


def test_a_hand_written_log_sum_exp_is_not_taken_for_torchs():
    """Only torch.logsumexp's exact decomposition becomes the template's logsumexp reduction:
    log(sum(exp(y - max))) (the max not added back) reads the row again after its max, so it runs
    statement by statement on the whole row ("tile_row") and still matches eager."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 16)

        def forward(self, x):
            y = self.l(x)
            return (y - y.amax(1, keepdim=True)).exp().sum(1).log()

    torch.manual_seed(0)
    model, x = M(), torch.randn(4, 8)
    g, group, fused = _fused_linear(model, x, "fp32")
    assert fused.reduce == "tile_row"
    text, ins = gemm_epilogue.render(fused, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4}, "fp32")
    _assert_fused_matches(g, model, x, group, text, ins, "hand_lse", 1e-5)


def test_gemm_logsumexp_keeps_torchs_infinities():
    """The row-reduction GEMM's logsumexp over several column tiles matches torch.logsumexp on rows
    holding +inf (in a later tile), only -inf, some -inf, or NaN."""
    from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
    from kernelwright.codegen.triton_gemm import render_gemm_rowreduce

    torch.manual_seed(0)
    a, b, e = torch.randn(6, 16), torch.randn(16, 40), torch.zeros(6, 40)
    e[0, 37] = float("inf")
    e[1] = float("-inf")
    e[2, :20] = float("-inf")
    e[3, 5] = float("nan")
    e[4, 3] = 100.0  # a large finite max in the first tile, smaller values after it
    text = render_gemm_rowreduce(Epilogue((EpilogueOperand("e0", "full"),), "acc = acc + e0"), name="lse_edges")
    mod = load_module_from_source(text, "lse_edges", os.path.join(ROOT, ".pytest_kw_cache"))
    out = mod.launch(a, b, e, reduce="logsumexp", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4)
    want = torch.logsumexp(a @ b + e, 1)
    assert out[0] == float("inf") and out[1] == float("-inf") and out[3].isnan()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_gemm_epilogue_refuses_groups_with_reductions():
    """A softmax over the GEMM's columns (dim 0) is not a reduction over each row."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 6)

        def forward(self, x):
            return torch.softmax(self.l(x), 0)

    g = capture(from_module(M(), [torch.randn(4, 8)]))
    plan = plan_graph(g)
    gemm = next(g.node(u.node) for u in plan.units if u.node and g.node(u.node).target in gemm_epilogue.GEMMS)
    assert "reductions" in gemm_epilogue.fusable(g, gemm, plan.groups[0])


@pytest.mark.parametrize("n,fits", [(256, True), (257, False)])
def test_gemm_row_reduction_needs_a_row_to_fit_one_tile(n, fits):
    """Linear -> sigmoid -> row sum folds into the GEMM only up to ROW_REDUCTION_MAX_N columns
    (wider rows measured 2x slower than cuBLAS + a reduction kernel on the H200)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, n)

        def forward(self, x):
            return torch.sigmoid(self.l(x)).sum(1)

    g = capture(from_module(M(), [torch.randn(4, 8)]))
    plan = plan_graph(g)
    ((gemm, group),) = _gemm_groups(g, plan)
    why = gemm_epilogue.fusable(g, gemm, group)
    assert (why is None) if fits else ("does not fit one tile" in why)


def test_fused_gemm_space_is_persistent_only_without_in_kernel_casts():
    """A fused GEMM with tiles enough (8192 x 1024) is offered as persistent TMA kernels under tf32;
    under bf16, where the kernel rounds the float32 activation itself, it is not."""
    from kernelwright.plan.rewrites import rewrite
    from kernelwright.search.units import fused_gemm_space

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(64, 1024)

        def forward(self, x):
            return F.gelu(self.l(x))

    x = torch.randn(8192, 64)
    for policy, persistent in (("tf32", True), ("bf16", False)):
        g = rewrite(capture(from_module(M(), [x])), policy)[0]
        plan = plan_graph(g)
        ((gemm, group),) = _gemm_groups(g, plan)
        fused = gemm_epilogue.build(g, gemm, group, plan.groups)
        assert bool(fused.prologue) == (policy == "bf16")
        space = fused_gemm_space(g, fused, policy)
        assert any(c.get("PERSISTENT") for c in space) == persistent and any(c.get("TMA") for c in space)
