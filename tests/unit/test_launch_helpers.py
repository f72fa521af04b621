"""The argument check of generated launchers (codegen/host.py `_expect`): an input in another layout
is copied, one in the expected layout passed through, and a broadcast is never faked."""
import pytest
import torch

from kernelwright.codegen.host import _expect as expect


def test_launch_helpers_copy_other_layouts_but_never_fake_a_broadcast():
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
