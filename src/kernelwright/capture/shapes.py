"""Stride arithmetic on shapes: contiguous layouts, broadcasting, and views that split or merge dims."""
from __future__ import annotations

import math


def broadcast_strides(shape, strides, target) -> tuple[int, ...] | None:
    """Strides of a (shape, strides) tensor broadcast right-aligned to `target`; None if it does not broadcast."""
    off = len(target) - len(shape)
    if off < 0:
        return None
    out = []
    for j, size in enumerate(target):
        k = j - off
        if k < 0 or shape[k] == 1:
            out.append(0)
        elif shape[k] == size:
            out.append(strides[k])
        else:
            return None
    return tuple(out)


def refine_strides(shape, strides, target) -> tuple[int, ...] | None:
    """Strides for viewing a (shape, strides) tensor with shape `target` (same element count),
    splitting and merging dims as `Tensor.view` would; None where the view needs a copy."""
    if math.prod(shape) != math.prod(target):
        return None
    pieces = [(s, st) for s, st in zip(shape, strides) if s != 1]
    out: list[int] = []
    for t in reversed(target):
        if t == 1:
            out.append(0)
            continue
        need, first, prev = t, None, None
        while need > 1:
            if not pieces:
                return None
            size, st = pieces[-1]
            if prev is not None and st != prev[1] * prev[0]:
                return None  # merging two dims that are not adjacent in memory
            if first is None:
                first = st
            if size <= need:
                if need % size:
                    return None
                need //= size
                prev = pieces.pop()
            else:
                if size % need:
                    return None
                pieces[-1] = (size // need, st * need)
                need = 1
        out.append(first)
    if pieces:
        return None
    return tuple(reversed(out))


def contiguous_strides(shape) -> tuple[int, ...]:
    """Row-major strides of a tensor of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def channels_last_strides(shape) -> tuple[int, ...]:
    """Strides of a contiguous [N, C, *spatial] tensor stored channels-last (NHWC / NDHWC)."""
    c, spatial = shape[1], tuple(shape[2:])
    inner = contiguous_strides(spatial + (c,))  # strides of [*spatial, C]
    return (c * math.prod(spatial), inner[-1]) + tuple(inner[:-1])


def strides_ordered_like(shape, like) -> tuple[int, ...]:
    """Dense strides of a tensor of `shape` whose dims lie in memory in the order of the strides
    `like` (of a tensor of the same rank): the largest stride outermost, ties in dim order. (The
    statistics of a channels-last tensor over its last dims, laid out so, keep its channels
    innermost.)"""
    order = sorted(range(len(shape)), key=lambda d: (-like[d], d))
    out, acc = [0] * len(shape), 1
    for d in reversed(order):
        out[d] = acc
        acc *= shape[d]
    return tuple(out)


def dense_permuted(shape, stride) -> bool:
    """Whether a layout covers its elements exactly once, in some order of the dims (contiguous,
    channels-last, a transpose; not an expanded / stride-0 or a sliced view)."""
    dims = sorted((st, sh) for sh, st in zip(shape, stride) if sh != 1)
    expect = 1
    for st, sh in dims:
        if st != expect:
            return False
        expect *= sh
    return True
