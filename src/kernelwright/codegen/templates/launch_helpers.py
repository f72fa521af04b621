# Launcher helpers appended to every generated kernel module (see codegen/templating.launch_helpers).
import torch


def _alloc(shape, dtype, device, stride=None):
    """Output allocation (contiguous, or with the given strides, e.g. channels-last); verification
    replaces this with a NaN-poisoning allocator."""
    if stride is not None:
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _expect(t, shape, stride, name, dtype=None):
    """The input in the layout the kernel was specialised for.

    Shape (and dtype, when given) must match. Other strides are copied into the expected layout
    first (correct, one extra copy), except where the kernel expects a broadcast (stride 0), which
    a copy cannot produce."""
    if tuple(t.shape) != tuple(shape) or (dtype is not None and t.dtype != dtype):
        raise ValueError(f"{name}: expected {dtype or t.dtype} shape {tuple(shape)}, got {t.dtype} {tuple(t.shape)}")
    if any(n != 1 and s != e for n, s, e in zip(shape, t.stride(), stride)):
        if any(n != 1 and e == 0 for n, e in zip(shape, stride)):
            raise ValueError(f"{name}: expected a broadcast (stride 0) layout {stride}, got strides {t.stride()}")
        t = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
    return t
