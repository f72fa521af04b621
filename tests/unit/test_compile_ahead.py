"""build/compile_ahead.py: a batch of candidates' Triton kernels compiled side by side before
their first runs, none of them launched."""
from types import SimpleNamespace

import pytest
import torch
from triton.runtime.jit import KernelInterface

from kernelwright.build.compile_ahead import compile_ahead


class FakeKernel(KernelInterface):
    """Records launches and warmups (what Triton's JIT would run and compile)."""

    def __init__(self):
        self.launched, self.warmed = [], []

    def run(self, *args, grid, warmup, **kwargs):
        (self.warmed if warmup else self.launched).append((grid, args, kwargs))


def _module(direct, helper, fail=False):
    """A generated module's shape: kernels launched as fn[grid](...) and through `_launch`."""
    mod = SimpleNamespace()
    mod._launch = lambda kernel, grid, *args, **meta: kernel[grid](*args, **meta)  # (host.py's slow path)

    def launch(x):
        direct[(4,)](x, BLOCK=8)
        if fail:
            raise ValueError("a launcher's own check")
        mod._launch(helper, (2,), x, BLOCK=4)
        return x + 1

    mod.launch = launch
    return mod


def test_launches_become_warmups_and_everything_is_put_back(monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", "2")
    k1, k2, k3 = FakeKernel(), FakeKernel(), FakeKernel()
    m1, m2 = _module(k1, k2), _module(k3, FakeKernel(), fail=True)
    launch_helper = m1._launch
    x = torch.ones(3)
    assert compile_ahead([(m1, [x]), (m2, [x])]) == 0  # (fake kernels submit no compile)
    assert [w[0] for w in k1.warmed] == [(4,)] and k1.warmed[0][2] == {"BLOCK": 8}
    assert [w[0] for w in k2.warmed] == [(2,)] and len(k3.warmed) == 1  # the raising launcher: ignored
    assert not (k1.launched or k2.launched or k3.launched)  # nothing ran
    assert m1._launch is launch_helper
    k1[(1,)](x)  # fn[grid] launches again afterwards
    assert k1.launched == [((1,), (x,), {})]


def test_the_compile_threads_come_from_the_environment(monkeypatch):
    from kernelwright.build.compile_ahead import MAX_WORKERS, workers_from_env
    from kernelwright.errors import UserError

    monkeypatch.delenv("KERNELWRIGHT_COMPILE_WORKERS", raising=False)
    assert 1 <= workers_from_env(100) <= MAX_WORKERS and workers_from_env(2) <= 2
    monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", "3")
    assert workers_from_env(100) == 3 and workers_from_env(2) == 2
    monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", "0")  # off: launches stay launches until their first run
    k = FakeKernel()
    assert compile_ahead([(_module(k, FakeKernel()), [torch.ones(1)])] * 2) == 0 and not k.warmed
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", bad)
        with pytest.raises(UserError, match="KERNELWRIGHT_COMPILE_WORKERS"):
            workers_from_env(4)


def test_a_single_call_is_left_to_its_first_run(monkeypatch):
    monkeypatch.setenv("KERNELWRIGHT_COMPILE_WORKERS", "2")
    k = FakeKernel()
    assert compile_ahead([(_module(k, FakeKernel()), [torch.ones(1)])]) == 0
    assert not k.warmed and not k.launched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_kernels_are_compiled_before_their_first_launch(tmp_path):
    from kernelwright.build.pyload import load_module_from_source

    src = '''
import torch
import triton
import triton.language as tl
from kernelwright.codegen.host import _launch


@triton.jit
def add_kernel(x_ptr, y_ptr, n, C: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + C, mask=i < n)


def launch(x):
    y = torch.empty_like(x)
    _launch(add_kernel, (triton.cdiv(x.numel(), 128),), x, y, x.numel(), C=%s, BLOCK=128)
    return y
'''
    mods = [load_module_from_source(src % c, f"add{c}", tmp_path) for c in (1.0, 2.0)]
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    assert compile_ahead([(m, [x]) for m in mods]) == 2
    for c, m in zip((1.0, 2.0), mods):
        assert sum(len(caches[0]) for caches in m.add_kernel.device_caches.values()) == 1  # compiled, not run
        torch.testing.assert_close(m.launch(x), x + c)
