"""plan.instance_norm: torch's lowering of instance norm (a batch norm over a [1, N*C, ...] view)
rewritten over the input's own dims, so one normalization group over [N, C, *spatial] computes
it with per-channel operands and channels-last inputs."""
import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.capture.execute import run_graph
from kernelwright.plan import plan_graph
from kernelwright.plan.instance_norm import instance_norm_rows
from kernelwright.plan.rewrites import rewrite
from kernelwright.problem import from_module


class ConvIN(nn.Module):
    def __init__(self, conv, norm):
        super().__init__()
        self.conv, self.norm = conv, norm

    def forward(self, x):
        return self.norm(self.conv(x) * 2.0) / 2.0


@pytest.mark.parametrize("make,shape", [
    (lambda: ConvIN(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4)), (2, 3, 7, 6)),
    (lambda: ConvIN(nn.Conv3d(2, 3, 2), nn.InstanceNorm3d(3, eps=1e-3)), (2, 2, 4, 5, 4)),
])
def test_instance_norm_over_its_own_dims(make, shape):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(*shape) * 3 + 1
    g = capture(from_module(model, [x]))
    r, notes = instance_norm_rows(g)
    assert any("instance norm" in n for n in notes)
    assert not any(n.target == "aten._native_batch_norm_legit.no_stats" for n in r.nodes)
    wide = make().double().eval()
    wide.load_state_dict(model.state_dict())
    with torch.no_grad():
        want, got = run_graph(g, wide, [x.double()]), run_graph(r, wide, [x.double()])
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
    # after the policy's rewrites, one normalization group over [N, C, *spatial] holds the conv's
    # bias, the norm and the ops around it
    s, _ = rewrite(g, "tf32")
    groups = plan_graph(s).groups
    norm = [gr for gr in groups if gr.kind == "normalization"]
    assert len(norm) == 1 and tuple(norm[0].domain) == tuple(model.conv(x).shape)
    assert tuple(norm[0].rdims) == tuple(range(2, len(shape)))


def test_other_batch_norms_are_left_alone():
    """A training batch norm is not an instance norm; an affine instance norm stays correct."""
    model, x = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train(), torch.randn(2, 3, 6, 6)
    g = capture(from_module(model, [x]))
    assert instance_norm_rows(g) == (g, [])
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True)).eval()
    g = capture(from_module(model, [x]))
    r, _ = instance_norm_rows(g)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(r, model, [x])[0], model(x), rtol=1e-5, atol=1e-5)
