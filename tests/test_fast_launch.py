"""Generated launchers call a compiled kernel directly after its first launch
(templates/launch_helpers.py `_launch`); a call Triton would specialise differently goes back
through the JIT."""
import os

import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
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
        pytest.skip("needs the Triton interpreter (make test sets TRITON_INTERPRET=1)")
    mod = _module(1000, tmp_path)
    x = torch.randn(1000)
    out, = mod.launch(x)
    torch.testing.assert_close(out, Act()(x))
    assert mod._COMPILED == {}


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
    assert len(mod._COMPILED) == 2
    assert all(k[2][0] == torch.float32 for k in mod._COMPILED)  # the dtype is part of the signature


def test_scratch_buffers_are_reused_per_name(tmp_path):
    """Split reductions' work buffers: allocated once per name (and device, stream), then reused."""
    mod = _module(64, tmp_path)
    dev = torch.device("cpu")
    a = mod._scratch("part0", (3, 4, 8), dev)
    assert a.shape == (3, 4, 8) and a.dtype == torch.float32
    assert mod._scratch("part0", (3, 4, 8), dev) is a
    assert mod._scratch("rb0", (4,), dev) is not a
