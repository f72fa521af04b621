"""Stride arithmetic (capture/shapes.py): dense layouts ordered like another tensor's."""
import torch

from kernelwright.capture.shapes import channels_last_strides, contiguous_strides, strides_ordered_like


def test_strides_ordered_like_follow_the_other_tensors_dim_order():
    cl = channels_last_strides((2, 6, 4, 6, 4))
    # statistics over the last dim of a channels-last 5-D tensor: channels innermost, then the rest in order
    assert strides_ordered_like((2, 6, 4, 6, 1), cl) == (144, 1, 36, 6, 6)
    assert strides_ordered_like((2, 6, 4, 6, 4), cl) == cl  # the same shape: the same layout
    assert strides_ordered_like((3, 5, 7), contiguous_strides((3, 5, 7))) == (35, 7, 1)
    t = torch.empty(4, 3, 5).transpose(0, 2)  # [5, 3, 4] with strides (1, 5, 15)
    assert strides_ordered_like((5, 3, 4), t.stride()) == t.stride()
