"""Group codegen beyond the basics: views of the domain (group norm), instance norm, Welford
passes, split reductions, and the GEMM + epilogue fusion — all run in the Triton interpreter."""
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen import gemm_epilogue
from kernelwright.capture.shapes import broadcast_strides, refine_strides
from kernelwright.codegen.triton_group import Unsupported, render_group
from kernelwright.emit.module import import_model_new, ModeForward, render_model_new, write_module
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module, load_problem

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_refine_strides_splits_and_merges_like_view():
    assert refine_strides((4, 8, 3, 5), (120, 15, 5, 1), (4, 2, 4, 15)) == (120, 60, 15, 1)
    assert refine_strides((4, 8, 15), (120, 15, 1), (4, 2, 4, 15)) == (120, 60, 15, 1)
    assert refine_strides((2, 3), (1, 2), (6,)) is None  # transposed: a view cannot merge it
    assert refine_strides((6,), (1,), (4,)) is None  # element counts differ
    assert broadcast_strides((3, 1), (1, 1), (2, 3, 5)) == (0, 1, 0)
    assert broadcast_strides((4,), (1,), (2, 3)) is None


def _groups_match(model, x, configs):
    """Render every group of `model` with each config and compare with the library values."""
    g = capture(from_module(model, [x]))
    plan = plan_graph(g)
    env = run_graph(g, model, [x], keep=True)
    checked = 0
    for grp in plan.groups:
        for cfg in configs:
            k = render_group(g, grp, cfg)
            mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
            for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
                torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)
                checked += 1
    return plan, checked


ONE = {"BLOCK_M": 2, "BLOCK_R": 256, "one_pass": True, "num_warps": 4}
MULTI = {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4}


def test_group_norm_with_activation_is_one_kernel_over_a_refined_domain():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gn = nn.GroupNorm(4, 8)
            nn.init.normal_(self.gn.weight)
            nn.init.normal_(self.gn.bias)

        def forward(self, x):
            return torch.tanh(self.gn(x))

    plan, checked = _groups_match(M(), torch.randn(3, 8, 5, 3), [ONE, MULTI])
    (grp,) = plan.groups
    assert tuple(grp.domain) == (3, 4, 2, 15) and grp.rdims == (2, 3)
    assert checked == 2


def test_instance_norm_and_var_use_welford_passes():
    torch.manual_seed(0)

    class M(nn.Module):
        def forward(self, x):
            return F.instance_norm(x) + x.var(dim=(2, 3), keepdim=True)

    _, checked = _groups_match(M(), torch.randn(2, 3, 6, 7) * 3 + 5, [ONE, MULTI])
    assert checked >= 2


def test_welford_step_reciprocal_keeps_the_variance_exact_with_masked_tails():
    """The Welford loops multiply by one reciprocal per step (triton_group.WELFORD_STEP): rows of
    1000 elements (a masked tail in the last step, a split whose last chunk is partly and one wholly
    past the end) around a mean of 1000 still give the float64 variance to float32 accuracy."""
    torch.manual_seed(1)

    class Var(nn.Module):
        def forward(self, x):
            return x.var(dim=1, keepdim=True)

    x = torch.randn(3, 1000) * 2 + 1000
    g = capture(from_module(Var(), [x]))
    (grp,) = plan_graph(g).groups
    ref = x.double().var(dim=1, keepdim=True)
    for cfg in (MULTI, dict(MULTI, BLOCK_R=64), {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 10, "one_pass": False, "num_warps": 4}):
        k = render_group(g, grp, cfg)
        assert "1.0 / ((r0 - " in k.source
        assert "delta / tl.maximum" not in k.source and "d0 / tl.maximum" not in k.source
        mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
        (out,) = mod.launch(*[x if v == g.user_inputs[0].name else None for v in k.inputs])
        torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=0)


def test_split_reduction_matches_and_refuses_domain_outputs():
    torch.manual_seed(0)
    p = load_problem(os.path.join(ROOT, "problems/level1/mse_loss.py"), small=True)
    g = capture(p)
    model, x = p.make_model(), p.make_inputs(0)
    env = run_graph(g, model, x, keep=True)
    (grp,) = plan_graph(g).groups
    k = render_group(g, grp, {"BLOCK_M": 1, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4})
    assert "_partial" in k.source and "_finish" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
    (out,) = mod.launch(*[env[v] for v in k.inputs])
    torch.testing.assert_close(out, env[k.outputs[0]], rtol=1e-5, atol=1e-6)

    class Softmax(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    g2 = capture(from_module(Softmax(), [torch.randn(2, 40)]))
    with pytest.raises(Unsupported):
        render_group(g2, plan_graph(g2).groups[0], {"BLOCK_M": 1, "BLOCK_R": 16, "SPLIT": 2, "one_pass": False})


def test_gemm_epilogue_fusion_emits_a_working_module(tmp_path):
    """Strategy 2: addmm + gelu*scale as one Triton GEMM, emitted into ModelNew in place of both units."""
    torch.manual_seed(0)
    p = load_problem(os.path.join(ROOT, "problems/level2/gemm_gelu_scale.py"), small=True)
    g = capture(p)
    plan = plan_graph(g)
    gemm = next(g.node(u.node) for u in plan.units if u.node and g.node(u.node).target in gemm_epilogue.GEMMS)
    group = next(grp for grp in plan.groups if gemm.name in grp.inputs)
    assert gemm_epilogue.fusable(g, gemm, group) is None
    fused = gemm_epilogue.build(g, gemm, group)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "num_warps": 4, "num_stages": 1}
    text, ins = gemm_epilogue.render(fused, cfg, "fp32")
    kernels = {group.id: ("g_gemm", ins, list(group.outputs), False), gemm.name: None}
    path = write_module(tmp_path, render_model_new(p, [ModeForward("any", plan, kernels, {"g_gemm": text}, [])], "fp32", None), {"g_gemm": text})
    body = path.read_text().split("def _kw_forward_any", 1)[1]
    assert "_k_g_gemm.launch(" in body and "addmm" not in body
    mod = import_model_new(path)
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(7)
    torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-5)


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


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 2, "BLOCK_R": 16, "SPLIT": 4, "one_pass": False, "num_warps": 4},  # partial / finish / apply
    {"BLOCK_M": 2, "BLOCK_R": 16, "one_pass": False, "num_warps": 4},
    {"BLOCK_M": 4, "BLOCK_R": 256, "one_pass": True, "num_warps": 4},
], ids=["split", "multi", "one"])
def test_training_batch_norm_updates_running_stats_in_the_kernel(cfg):
    """Training-mode batch norm + relu as one group: normalised output and the new running mean and
    (unbiased) variance, also when each channel's statistics are split over several programs."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU())
    nn.init.normal_(m[0].weight)
    nn.init.normal_(m[0].bias)
    m[0].running_mean.normal_()
    m[0].running_var.uniform_(0.5, 2)
    x = torch.randn(4, 3, 5, 7) * 2 + 1
    g = capture(from_module(m, [x]))
    (grp,) = plan_graph(g).groups
    assert {n for n, fqn in g.mutations.items() if "running" in fqn} <= set(grp.outputs)
    env = run_graph(g, m, [x], keep=True)
    k = render_group(g, grp, cfg)
    if "SPLIT" in cfg:
        assert "_apply" in k.source
    mod = load_module_from_source(k.source, grp.id, os.path.join(ROOT, ".pytest_kw_cache"))
    for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
        torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)


def test_launch_helpers_copy_other_layouts_but_never_fake_a_broadcast():
    from kernelwright.codegen.host import _expect as expect

    x = torch.arange(12.0).reshape(3, 4)
    xt = x.t().contiguous().t()
    y = expect(xt, (3, 4), (4, 1), "x")
    assert y.stride() == (4, 1) and torch.equal(y, x)
    assert expect(x, (3, 4), (4, 1), "x") is x  # the right layout is passed through untouched
    with pytest.raises(ValueError, match="shape"):
        expect(x, (4, 3), (3, 1), "x")
    with pytest.raises(ValueError, match="broadcast"):
        expect(x, (3, 4), (0, 1), "x")  # the kernel would read row 0 only
    with pytest.raises(ValueError):
        expect(x.double(), (3, 4), (4, 1), "x", torch.float32)


@pytest.mark.parametrize("dim", [1, 0])
def test_flip_scan_flip_is_one_reverse_scan(dim, tmp_path):
    """flip -> cumsum -> flip becomes one kernel reading x backwards (rows and column layouts, one
    pass and chunked with a carry)."""
    from kernelwright.codegen.triton_scan import TEMPLATE as scan

    class Rev(nn.Module):
        def forward(self, x):
            return torch.cumsum(x.flip(dim), dim=dim).flip(dim)

    torch.manual_seed(0)
    x = torch.randn(6, 40)
    g = capture(from_module(Rev(), [x]))
    node = next(n for n in g.nodes if n.target == "aten.cumsum.default")
    nodes, src, last = scan.absorbed(g, node)
    assert src == "x" and [g.node(n).target for n in nodes] == ["aten.flip.default", "aten.cumsum.default",
                                                                "aten.flip.default"]
    configs = scan.space(g, node)
    assert configs and all(c["reverse"] for c in configs)
    env = run_graph(g, Rev(), [x], keep=True)
    picks = [c for c in configs if c["one_pass"]][:1] + [c for c in configs if not c["one_pass"]][:2]
    assert len(picks) == 3
    for cfg in picks:
        k = scan.render(g, node, cfg, {0})
        mod = load_module_from_source(k.source, f"rev{dim}", tmp_path)
        (out,) = mod.launch(env["x"])
        torch.testing.assert_close(out, env[last], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [1, 0])
def test_shift_then_scan_is_one_exclusive_scan(dim, tmp_path):
    """cat([zeros, x[:-1]]) -> cumsum (an exclusive prefix sum) becomes one kernel reading x
    shifted by one; the fill must be the scan's neutral element."""
    from kernelwright.codegen.triton_scan import TEMPLATE as scan

    class Excl(nn.Module):
        def forward(self, x):
            n = x.size(dim)
            shifted = torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), x.narrow(dim, 0, n - 1)], dim=dim)
            return torch.cumsum(shifted, dim=dim)

    class OnesFill(nn.Module):  # not exclusive for a sum: must not match
        def forward(self, x):
            return torch.cumsum(torch.cat([torch.ones_like(x.narrow(1, 0, 1)), x.narrow(1, 0, 39)], dim=1), dim=1)

    torch.manual_seed(0)
    x = torch.randn(6, 40)
    g = capture(from_module(Excl(), [x]))
    node = next(n for n in g.nodes if n.target == "aten.cumsum.default")
    nodes, src, out_name = scan.absorbed(g, node)
    assert src == "x" and out_name == node.name and "aten.cat.default" in [g.node(n).target for n in nodes]
    configs = scan.space(g, node)
    assert all(c["exclusive"] for c in configs)
    env = run_graph(g, Excl(), [x], keep=True)
    picks = [c for c in configs if c["one_pass"]][:1] + [c for c in configs if not c["one_pass"]][:2]
    for cfg in picks:
        k = scan.render(g, node, cfg, {0})
        (out,) = load_module_from_source(k.source, f"excl{dim}", tmp_path).launch(env["x"])
        torch.testing.assert_close(out, env[node.name], rtol=1e-5, atol=1e-5)
    g2 = capture(from_module(OnesFill(), [x]))
    assert scan.absorbed(g2, next(n for n in g2.nodes if n.target == "aten.cumsum.default")) is None


@pytest.mark.parametrize("policy,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_original_forward_fallback_keeps_the_policy(tmp_path, policy, dtype):
    """When the generated program loses (or capture fails), ModelNew runs the original forward;
    under bf16 it does so in bf16 autocast, as the eager baseline it is compared with (without it
    the fallback ran float32 GEMMs and was timed 10x slower than eager on the H200)."""
    p = load_problem(os.path.join(ROOT, "problems", "level2", "gemm_bias_relu.py"), small=True)
    path = write_module(tmp_path, render_model_new(p, [], policy, None), {})
    mod = import_model_new(path)
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(1)
    out = new(*x)
    assert out.dtype == dtype
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=policy == "bf16"):
        want = ref(*x)
    torch.testing.assert_close(out, want)


def test_forward_reads_weights_from_the_module_tables_or_through_attributes(tmp_path):
    """The forward (and the CUDA-graph state stamp) reads parameters and buffers from the modules'
    own tables, not through nn.Module attribute access (microseconds of host time each); a module
    whose weight is an attribute computed on the fly (no table entry) is read through attributes;
    running statistics are updated in the tensors the forward read."""
    p = load_problem(os.path.join(ROOT, "problems", "level3", "resnet_basic_block.py"), small=True)
    plan = plan_graph(capture(p))
    text = render_model_new(p, [ModeForward("any", plan, {}, {}, [])], "fp32", None)
    body = text.split("def _kw_compute_any", 1)[1]  # (it updates running statistics: compute and commit)
    assert "self.conv1.weight" not in body and "= _kw_tensors(self)" in body
    assert "self._modules['bn1']._buffers['running_mean']" in text
    mod = import_model_new(write_module(tmp_path, text, {}))
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(1)
    with torch.no_grad():  # (with gradients on, the module runs the original forward)
        torch.testing.assert_close(new(*x), ref(*x))
    torch.testing.assert_close(new.bn2.running_var, ref.bn2.running_var)
    assert int(new.bn1.num_batches_tracked) == 1

    class Doubled(nn.Module):  # conv2's weight as a property: no entry in _parameters
        def __init__(self, conv):
            super().__init__()
            self.w_half = nn.Parameter(conv.weight.detach() / 2)

        @property
        def weight(self):
            return self.w_half * 2

    from kernelwright.emit.graphs import stamp as identity

    stamp = identity(*mod._kw_tensors(new))
    new.conv2 = Doubled(new.conv2)
    assert identity(*mod._kw_tensors(new)) != stamp
    with torch.no_grad():
        torch.testing.assert_close(new(*x), ref(*x))


@pytest.mark.parametrize("block_m,block_r,apply_q,reverse", [(1, 64, None, False), (1, 16, None, False),
                                                             (2, 16, None, False), (4, 8, None, False),
                                                             (8, 16, None, False), (2, 16, 4, False),
                                                             (4, 8, 64, False), (2, 16, 4, True), (1, 16, None, True)])
def test_group_norm_over_channels_last_tiled_apply(block_m, block_r, apply_q, reverse):
    """tf32 group norm after a channels-last convolution, returned NCHW: the split schedule's
    apply pass walks [pixels, channels of a group] tiles (reads along channels, writes along
    pixels) and computes the same values as the library."""
    from kernelwright.codegen.triton_group import lower, tiled_apply_dims
    from kernelwright.plan.rewrites import rewrite

    p = load_problem(os.path.join(ROOT, "problems", "level2", "conv2d_group_norm_tanh.py"), small=True)
    g = rewrite(capture(p), "tf32")[0]
    grp = next(x for x in plan_graph(g).groups if x.kind == "normalization")
    low = lower(g, grp)
    Q, P = tiled_apply_dims(low)
    assert Q * P == math.prod(grp.domain[2:]) and P == grp.domain[2]  # pixels x channels of a group
    model = p.make_model()
    with torch.no_grad():
        env = run_graph(g, model, p.make_inputs(2), keep=True)
    # BLOCK_M > 1: neighbouring groups' channels side by side in one tile (8: more rows than M=4)
    # APPLY_Q: the apply tile's height set apart from BLOCK_R (4: fewer pixels than one tile of 64)
    cfg = {"BLOCK_M": block_m, "BLOCK_R": block_r, "SPLIT": 4, "one_pass": False, "num_warps": 4, "TILED_APPLY": True}
    if apply_q:
        cfg["APPLY_Q"] = apply_q
    if reverse:  # APPLY_REVERSE: tiles walked last to first
        cfg["APPLY_REVERSE"] = True
    k = render_group(g, grp, cfg, low)
    assert "tiled walk" in k.source
    assert ("tl.num_programs(1) - 1 - tl.program_id(1)" in k.source) == reverse
    if apply_q:
        assert f"BLOCK_R={apply_q}, num_warps" in k.source.split("_apply, (", 1)[1]
    mod = load_module_from_source(k.source, grp.id + f"_tiled{block_m}x{block_r}q{apply_q}r{int(reverse)}",
                                  os.path.join(ROOT, ".pytest_kw_cache"))
    for name, out in zip(k.outputs, mod.launch(*[env[v] for v in k.inputs])):
        torch.testing.assert_close(out, env[name], rtol=1e-5, atol=1e-5)


def test_pointwise_group_writes_a_view_of_its_domain():
    """transformer_block's last residual add under bf16: the fc2 GEMM's [B*T, C] result (bf16,
    widened), viewed [B, T, C] and added to x; the group's domain is the GEMM's 2-D shape and
    its output the 3-D view, which one kernel now writes (it was left to two library launches)."""
    from kernelwright.plan.rewrites import rewrite

    p = load_problem(os.path.join(ROOT, "problems", "level3", "transformer_block.py"), small=True)
    g = rewrite(capture(p), "bf16")[0]
    grp = next(x for x in plan_graph(g).groups if x.rdims is None and "aten.add.Tensor" in
               [g.node(n).target for n in x.nodes] and len(g.meta(x.outputs[0]).shape) > len(x.domain))
    with torch.no_grad():
        env = run_graph(g, p.make_model(), p.make_inputs(3), keep=True)
    k = render_group(g, grp, {"BLOCK_M": 64, "BLOCK_R": 1, "num_warps": 4, "num_stages": 1, "one_pass": False})
    mod = load_module_from_source(k.source, grp.id + "_viewout", os.path.join(ROOT, ".pytest_kw_cache"))
    outs = mod.launch(*[env[v] for v in k.inputs])
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    for name, out in zip(k.outputs, outs):
        assert out.shape == env[name].shape
        torch.testing.assert_close(out, env[name], rtol=0, atol=0)
