"""Scan node template (codegen/triton_scan.py): cumsum/cumprod kernels run in the Triton interpreter
against the library values of the captured graph."""
from __future__ import annotations


from pathlib import Path

import pytest
import torch

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.codegen.node_kernels import NodeKernel, used_outputs
from kernelwright.codegen.triton_scan import TEMPLATE
from kernelwright.problem import from_module, load_problem
from kernelwright.space.config import Config
from fn_module import Fn

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
SCANS = ("aten.cumsum.default", "aten.cumprod.default")


def _setup(fn, x):
    model = Fn(fn)
    graph = capture(from_module(model, [x]))
    env = run_graph(graph, model, [x], keep=True)
    node = next(n for n in graph.nodes if n.target in SCANS)
    return graph, node, env


def _poison(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _run(graph, node, env, cfg, tmp_path):
    params = cfg.as_dict() if isinstance(cfg, Config) else dict(cfg)
    k = TEMPLATE.render(graph, node, params, used_outputs(graph, node))
    assert isinstance(k, NodeKernel) and k.outputs == 1 and k.inputs == [node.args[0].name]
    mod = load_module_from_source(k.source, f"scan_{node.name}", tmp_path)
    mod._alloc = _poison  # every element must be written
    res = mod.launch(*[env[v] for v in k.inputs])
    assert isinstance(res, tuple) and len(res) == 1
    torch.testing.assert_close(res[0], env[node.name], rtol=1e-5, atol=1e-5)
    return k, mod


def _cfg(**kw):
    return Config.make("triton.scan", num_stages=1, **kw)


def _pos(*shape):
    return torch.rand(*shape) * 0.2 + 0.9  # factors near 1 keep products in range


# -- last dim (rows layout) -------------------------------------------------------------------

@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_last_dim_one_pass_and_chunked(op, tmp_path):
    fn = (lambda x: torch.cumsum(x, 1)) if op == "cumsum" else (lambda x: torch.cumprod(x, -1))
    graph, node, env = _setup(fn, _pos(5, 70) if op == "cumprod" else torch.randn(5, 70))
    assert TEMPLATE.supports(graph, node, {0}) is None
    _run(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    _run(graph, node, env, _cfg(BLOCK_M=2, BLOCK_N=128, one_pass=True, num_warps=1), tmp_path)
    # 70 = 4 chunks of 16 + 6: the last chunk is partial, rows 5 = 2 programs of 4 (one partial)
    k, _ = _run(graph, node, env, _cfg(BLOCK_M=4, BLOCK_N=16, one_pass=False, num_warps=1), tmp_path)
    assert "carry" in k.source and "for n0 in range" in k.source
    _run(graph, node, env, _cfg(BLOCK_M=1, BLOCK_N=32, one_pass=False, num_warps=2), tmp_path)


def test_dtype_kwarg_float32(tmp_path):
    graph, node, env = _setup(lambda x: torch.cumsum(x, dim=-1, dtype=torch.float32), torch.randn(3, 33))
    assert TEMPLATE.supports(graph, node, {0}) is None
    _run(graph, node, env, _cfg(BLOCK_M=2, BLOCK_N=16, one_pass=False, num_warps=1), tmp_path)


# -- non-last dims (cols layout) ----------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_non_last_dim(op, dim, tmp_path):
    f = torch.cumsum if op == "cumsum" else torch.cumprod
    x = _pos(9, 6, 20) if op == "cumprod" else torch.randn(9, 6, 20)
    graph, node, env = _setup(lambda t: f(t, dim), x)
    assert TEMPLATE.supports(graph, node, {0}) is None
    k, _ = _run(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    assert "BLOCK_INNER" in k.source
    _run(graph, node, env, _cfg(BLOCK_INNER=16, BLOCK_N=16, one_pass=True, num_warps=1), tmp_path)
    # chunks of 4 (9 and 6 are not multiples of 4), inner 20 not a multiple of 16
    _run(graph, node, env, _cfg(BLOCK_INNER=16, BLOCK_N=4, one_pass=False, num_warps=1), tmp_path)
    _run(graph, node, env, _cfg(BLOCK_INNER=32, BLOCK_N=1, one_pass=False, num_warps=1), tmp_path)


def test_strided_inputs(tmp_path):
    # scan over the contiguous-in-output last dim of a permuted (non-contiguous) input
    graph, node, env = _setup(lambda x: torch.cumsum(x.permute(2, 0, 1), 2), torch.randn(3, 4, 5))
    assert not graph.meta(node.args[0].name).contiguous
    _run(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    _run(graph, node, env, _cfg(BLOCK_M=4, BLOCK_N=2, one_pass=False, num_warps=1), tmp_path)
    # and over dim 0 of a transposed input
    graph, node, env = _setup(lambda x: torch.cumprod(x.transpose(0, 1), 0), _pos(3, 4, 5))
    _run(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
    _run(graph, node, env, _cfg(BLOCK_INNER=16, BLOCK_N=2, one_pass=False, num_warps=1), tmp_path)


# -- shipped problems (small sizes) -------------------------------------------------------------

@pytest.mark.parametrize("name", ["cumsum", "cumprod", "reverse_cumsum", "exclusive_cumsum"])
def test_shipped_problems_small(name, tmp_path):
    problem = load_problem(ROOT / "problems" / "level1" / f"{name}.py", small=True)
    graph = capture(problem)
    model, inputs = problem.make_model(), problem.make_inputs(0)
    env = run_graph(graph, model, inputs, keep=True)
    nodes = [n for n in graph.nodes if n.target in SCANS]
    assert nodes
    for node in nodes:
        assert TEMPLATE.supports(graph, node, used_outputs(graph, node)) is None
        pattern = TEMPLATE.absorbed(graph, node)
        if pattern is None:
            _run(graph, node, env, TEMPLATE.default(graph, node), tmp_path)
        else:  # flip -> cumsum -> flip: the default is one reverse scan from x to the last flip's value
            k = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node), {0})
            assert k.inputs == [pattern[1]]
            (out,) = load_module_from_source(k.source, "rev_default", tmp_path).launch(env[pattern[1]])
            torch.testing.assert_close(out, env[pattern[2]], rtol=1e-5, atol=1e-5)
        _run(graph, node, env, _cfg(BLOCK_M=2, BLOCK_N=16, one_pass=False, num_warps=1), tmp_path)


# -- space, default, refusals ---------------------------------------------------------------

def test_space_and_default():
    for fn, shape in [(lambda x: torch.cumsum(x, 1), (4, 1000)), (lambda x: torch.cumsum(x, 1), (4, 5000)),
                      (lambda x: torch.cumprod(x, 0), (100, 300))]:
        model = Fn(fn)
        graph = capture(from_module(model, [torch.randn(*shape)]))
        node = next(n for n in graph.nodes if n.target in SCANS)
        space = TEMPLATE.space(graph, node)
        default = TEMPLATE.default(graph, node)
        assert space and default in space and len(set(space)) == len(space)
        assert all(c.template == "triton.scan" for c in space)
        assert {c["one_pass"] for c in space} == {True, False}
        for c in space:
            assert not c["one_pass"] or c["BLOCK_N"] >= shape[1 if node.args[1] == 1 else 0]
        TEMPLATE.render(graph, node, space[-1].as_dict(), {0})  # renders without running


def test_unsupported_cases_give_reasons():
    cases = [
        (lambda x: torch.cumsum(x, 1), torch.randn(3, 4, dtype=torch.float64)),
        (lambda x: torch.cumsum(x, 1, dtype=torch.float64), torch.randn(3, 4)),
        (lambda x: torch.cumsum(x, 1), torch.randint(0, 5, (3, 4))),
    ]
    for fn, x in cases:
        graph = capture(from_module(Fn(fn), [x]))
        node = next(n for n in graph.nodes if n.target in SCANS)
        why = TEMPLATE.supports(graph, node, {0})
        assert isinstance(why, str) and why and "\n" not in why
    graph = capture(from_module(Fn(lambda x: torch.flip(x, [1])), [torch.randn(3, 4)]))
    why = TEMPLATE.supports(graph, graph.nodes[0], {0})
    assert isinstance(why, str) and "cumsum" in why


def test_launch_checks_shape_and_copies_other_strides(tmp_path):
    graph, node, env = _setup(lambda x: torch.cumsum(x, 1), torch.randn(4, 8))
    k = TEMPLATE.render(graph, node, TEMPLATE.default(graph, node).as_dict(), {0})
    mod = load_module_from_source(k.source, "scan_check", tmp_path)
    with pytest.raises(ValueError):
        mod.launch(torch.randn(4, 9))
    xt = env["x"].t().contiguous().t()  # right shape, other strides: copied into the expected layout
    torch.testing.assert_close(mod.launch(xt)[0], mod.launch(env["x"])[0], rtol=0, atol=0)
    out, = mod.launch(env["x"])
    torch.testing.assert_close(out, env[node.name], rtol=1e-5, atol=1e-5)
