"""Patterns around a scan that the scan template (codegen/triton_scan.py) absorbs into its one kernel:
flip -> cumsum -> flip as a reverse scan, a shift by one element as an exclusive scan; the kernels run
in the Triton interpreter."""
import pytest
import torch
import torch.nn as nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


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
