"""The Python API: a live module + example inputs in, the same module with generated kernels out."""

import pytest
import torch
import torch.nn as nn

import kernelwright

pytestmark = pytest.mark.interpreter


def test_optimize_a_live_module(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Softmax(-1)).eval()
    model[1].running_mean.normal_()
    model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    expected = model(x)
    fast = kernelwright.optimize(model, [x], tmp_path / "out", budget_trials=2, db_path=str(tmp_path / "db.jsonl"))
    assert fast is model  # same parameters, new forward
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert "def attach(model)" in text and "class ModelNew" not in text
    assert list((tmp_path / "out" / "kernels").glob("*.py"))
    y = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(fast(x), expected, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        reference = nn.Sequential(*model)  # the original layers, original forward
        torch.testing.assert_close(fast(y), reference(y), rtol=1e-4, atol=1e-6)


def test_the_api_function_is_not_shadowed_by_a_submodule():
    import importlib

    importlib.import_module("kernelwright.pipeline")
    assert callable(kernelwright.optimize)


def test_a_live_module_in_training_mode_updates_its_running_statistics_once_per_call(tmp_path):
    """A forward that updates buffers is emitted as compute + commit (model_new.py.j2); attach()
    binds both, and each call updates the running statistics as the original forward does."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    fast = kernelwright.optimize(model, [x], tmp_path / "out", budget_trials=2, db_path=str(tmp_path / "db.jsonl"))
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert "def _kw_commit_train(" in text and "def _kw_compute_train(" in text
    for (name, a), (_, b) in zip(reference.named_buffers(), fast.named_buffers()):
        assert torch.equal(a, b), name  # optimizing left the statistics as they were
    with torch.no_grad():
        for seed in range(3):
            y = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(fast(y), reference(y), rtol=1e-4, atol=1e-5)
    for (name, a), (_, b) in zip(reference.named_buffers(), fast.named_buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert int(fast[1].num_batches_tracked) == int(reference[1].num_batches_tracked) == 3
