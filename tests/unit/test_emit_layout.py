"""The emitted forward returns each output in the strides eager returns it with."""
import torch

from kernelwright.capture.shapes import dense_permuted
from kernelwright.emit.runtime import eager_layout


def test_a_result_in_another_memory_order_is_copied_into_eagers():
    x = torch.randn(2, 3, 4, 5)
    cl = x.contiguous(memory_format=torch.channels_last)
    out = eager_layout(cl, x.stride())
    assert out.stride() == x.stride() and torch.equal(out, x)
    assert eager_layout(x, x.stride()) is x  # the same order: no copy
    assert eager_layout(None, (1,)) is None and eager_layout(x, (1, 2)) is x  # not a tensor, another rank


def test_dense_layouts_are_permutations_of_contiguous_ones():
    assert dense_permuted((2, 3, 4), (12, 4, 1)) and dense_permuted((2, 3, 4), (12, 1, 3))
    assert dense_permuted((2, 1, 4), (4, 99, 1))  # a size-1 dim's stride is free
    assert not dense_permuted((2, 3, 4), (0, 4, 1))  # a broadcast
    assert not dense_permuted((2, 3, 4), (24, 8, 2))  # every other element
