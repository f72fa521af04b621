"""Copies into a concatenation's slice (codegen/slice_copy.py): a channels / positions transpose
runs the tiled kernel, any other copy torch's copy_; both leave the rest of the buffer alone."""
from __future__ import annotations

import pytest
import torch

from kernelwright.codegen.slice_copy import _tiled, copy_into, into

pytestmark = pytest.mark.interpreter

CL = {4: torch.channels_last, 5: torch.channels_last_3d}


@pytest.mark.parametrize("shape", [(2, 5, 3, 7), (3, 4, 2, 3, 5), (2, 33, 9, 70), (1, 3, 1, 6)])
@pytest.mark.parametrize("buffer_cl", [False, True])
def test_a_value_goes_into_its_slice_in_either_layout(shape, buffer_cl):
    torch.manual_seed(0)
    extra = 6
    buf = torch.full((shape[0], shape[1] + extra, *shape[2:]), -7.0)
    if buffer_cl:
        buf = buf.to(memory_format=CL[len(shape)])
    x = torch.randn(*shape)
    x = x if buffer_cl else x.to(memory_format=CL[len(shape)])  # the other layout: a transpose
    dst = buf.narrow(1, 2, shape[1])
    assert _tiled(dst, x)
    s = into(buf, 1, 2, x)
    assert s.data_ptr() == dst.data_ptr() and torch.equal(s, x)
    assert (buf[:, :2] == -7).all() and (buf[:, 2 + shape[1]:] == -7).all()


def test_a_copy_in_the_same_layout_or_of_another_dtype_is_torchs():
    buf = torch.zeros(2, 8, 4, 4)
    x = torch.randn(2, 3, 4, 4)
    assert not _tiled(buf.narrow(1, 1, 3), x)  # both contiguous along the positions
    assert not _tiled(buf.narrow(1, 1, 3), x.to(memory_format=torch.channels_last).double())
    copy_into(buf.narrow(1, 1, 3), x)
    assert torch.equal(buf[:, 1:4], x) and not buf[:, 4:].any()


def test_a_copy_within_one_buffer_is_torchs():
    """A transpose between two regions of one storage goes through copy_ (which checks overlap)."""
    buf = torch.randn(2, 8, 4, 4)
    src = torch.as_strided(buf, (2, 3, 4, 4), (128, 1, 12, 3))  # channels-last, in channels 0-2's memory
    dst = buf.narrow(1, 4, 3)
    assert _tiled(dst.clone(), src.clone()) and not _tiled(dst, src)
    expected = src.clone()
    into(buf, 1, 4, src)
    assert torch.equal(buf[:, 4:7], expected)


def test_a_value_already_in_its_slice_is_not_copied():
    buf = torch.randn(2, 8, 4, 4)
    s = buf.narrow(1, 3, 2)
    before = buf.clone()
    assert into(buf, 1, 3, s).data_ptr() == s.data_ptr() and torch.equal(buf, before)
