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
