"""Generated launchers call a compiled kernel directly after its first launch (codegen/host.py
`_launch`, which kernel modules import); a call Triton would specialise differently goes back
through the JIT."""
import os

import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen import host
from kernelwright.codegen.triton_group import render_group
from kernelwright.plan import plan_graph
from kernelwright.problem import from_module

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                               reason="needs a CUDA GPU (compiled Triton, not the interpreter)")


class Act(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x + 1.0


def _module(n, tmp_path):
    graph = capture(from_module(Act(), [torch.randn(n)]))
    group = plan_graph(graph).groups[0]
    k = render_group(graph, group, {"BLOCK_M": 256, "BLOCK_R": 1, "one_pass": False, "num_warps": 4, "num_stages": 1})
    assert "_launch(" in k.source
    return load_module_from_source(k.source, "fast_launch", tmp_path)


def test_launcher_runs_through_launch_on_the_cpu(tmp_path):
    """In the interpreter (CPU tensors) `_launch` is the plain JIT call."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1: make test sets it, tests/conftest.py without a GPU)")
    mod = _module(1000, tmp_path)
    x = torch.randn(1000)
    out, = mod.launch(x)
    torch.testing.assert_close(out, Act()(x))
    assert not _compiled(mod)


def _compiled(mod):
    """The launches `_launch` keeps for `mod`'s kernels."""
    kernels = [v for v in vars(mod).values() if hasattr(v, "arg_names")]
    return [key for key in host._COMPILED if any(key[0] is k for k in kernels)]


@pytest.mark.gpu
@needs_gpu
def test_cached_launch_matches_and_respecialises_on_alignment(tmp_path):
    n = 1000
    mod = _module(n, tmp_path)
    buf = torch.randn(n + 1, device="cuda")
    for x in (buf[:n], buf[:n], buf[1:], buf[:n], buf[1:]):  # 16-byte aligned, then 4 bytes off
        out, = mod.launch(x)
        torch.testing.assert_close(out, Act()(x))
    # one compiled kernel per alignment signature; the repeats went straight to the launcher
    assert len(_compiled(mod)) == 2
    assert all(k[2][0] == torch.float32 for k in _compiled(mod))  # the dtype is part of the signature


def test_scratch_buffers_are_reused_per_name_and_shape():
    """Split reductions' work buffers: allocated once per name and shape (and device, stream),
    then reused."""
    dev = torch.device("cpu")
    a = host._scratch("part0", (3, 4, 8), dev)
    assert a.shape == (3, 4, 8) and a.dtype == torch.float32
    assert host._scratch("part0", (3, 4, 8), dev) is a
    assert host._scratch("rb0", (4,), dev) is not a
    assert host._scratch("part0", (3, 4, 16), dev).shape == (3, 4, 16)  # another kernel's, of its shape
