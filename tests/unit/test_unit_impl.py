"""search.units.unit_impl: a unit's chosen implementation as env -> env, the reference a fused
pair is timed and verified against."""
import torch

from kernelwright.search.plan_search import Chosen
from kernelwright.search.units import unit_impl

SOURCE = '''
import torch


def launch(x):
    return (x.amax(0), x.argmax(0))
'''


def test_a_kernel_returning_a_nodes_whole_tuple_binds_it_to_the_node(tmp_path):
    """A pool kernel that returns (values, indices) for a node read through getitem binds the
    tuple (the getitem then picks its values), not its first element."""
    run = unit_impl(None, ["pool"], Chosen("pool", ["x"], ["pool"], True), tmp_path, SOURCE, "cpu", "pool")
    x = torch.randn(3, 4)
    local = run({"x": x})
    values, indices = local["pool"]
    assert torch.equal(values, x.amax(0)) and torch.equal(indices, x.argmax(0))
    run = unit_impl(None, ["pool"], Chosen("pool", ["x"], ["v", "i"]), tmp_path, SOURCE, "cpu", "pool2")
    local = run({"x": x})
    assert torch.equal(local["v"], x.amax(0)) and torch.equal(local["i"], x.argmax(0))


def test_a_unit_whose_kernel_a_fused_pair_named_runs_that_kernel(tmp_path):
    """A pair that won stores its kernel under the last unit it computes, named apart from that
    unit (g1's "g1_conv"): the unit's implementation is that kernel, not its ATen ops (which would
    read the convolution result the fused kernel never writes)."""
    from types import SimpleNamespace

    from kernelwright.plan.fusion import Unit
    from kernelwright.search.plan_search import _unit_impl

    out = SimpleNamespace(kernels={"conv": None, "g1": Chosen("g1_conv", ["x"], ["v", "i"])},
                          sources={"g1_conv": SOURCE})
    job = SimpleNamespace(graph=None, out=out, cache_dir=tmp_path, device="cpu")
    plan = SimpleNamespace(units=[Unit(node="conv"), Unit(node="g1")])
    x = torch.randn(3, 4)
    assert _unit_impl(job, plan, "conv")({"x": x}) == {"x": x}  # computed inside the pair's kernel
    local = _unit_impl(job, plan, "g1")({"x": x})
    assert torch.equal(local["v"], x.amax(0)) and torch.equal(local["i"], x.argmax(0))
