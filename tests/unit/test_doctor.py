"""`kernelwright doctor` on this machine (CPU-only here; the GPU branch runs on the device)."""
from __future__ import annotations

import json

import pytest
import torch

from kernelwright import doctor


@pytest.fixture(scope="module")
def info():
    return doctor.collect()


def test_collect_is_json_and_complete(info):
    json.dumps(info)
    assert info["versions"]["torch"] == torch.__version__
    assert info["versions"]["triton"]
    assert {"cuda", "driver", "nvrtc", "triton_interpreter"} <= set(info["checks"])
    for c in info["checks"].values():
        assert isinstance(c["ok"], bool) and isinstance(c["detail"], str)
    text = doctor.render(info)
    assert "NVRTC" in text and "Triton interpreter" in text
    # installed from pyproject.toml, the package's entry point registers the torch.compile backend
    assert info["checks"]["compile_backend"]["ok"], info["checks"]["compile_backend"]["detail"]
    assert "torch.compile backend" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this test is for machines without a GPU")
def test_reports_no_gpu(info):
    assert info["gpus"] == []
    assert info["cuda"]["available"] is False
    assert not info["checks"]["cuda"]["ok"]
    assert doctor.NO_GPU_LINE in info["notes"]
    assert doctor.NO_GPU_LINE in doctor.render(info)
    assert info["checks"]["triton_interpreter"]["ok"], info["checks"]["triton_interpreter"]["detail"]
    assert "triton_gpu" not in info["checks"]


@pytest.mark.nvrtc
def test_nvrtc_compiles(info):
    c = info["checks"]["nvrtc"]
    assert c["ok"], c["detail"]
    assert "cubin" in c["detail"]
    ok, detail = doctor.check_nvrtc("sm_80")
    assert ok and "sm_80" in detail


def test_checks_never_raise(monkeypatch):
    ok, detail = doctor.check_nvrtc("sm_not_an_arch")
    assert not ok and "sm_not_an_arch" in detail

    def boom():
        raise RuntimeError("broken")

    c = doctor._check(boom)
    assert c["ok"] is False and "broken" in c["detail"]
    assert "FAIL" not in doctor.render({"checks": {"x": {"ok": True, "detail": "fine"}}})
