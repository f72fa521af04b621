"""capture.cumulative_bn: a momentum=None batch norm in train mode traced with a tensor factor,
computing what torch's module computes, and only while exporting."""
import torch

from kernelwright.capture import cumulative_bn
from kernelwright.capture.export import capture_module


def test_only_train_mode_cumulative_norms_with_statistics_are_patched_and_only_inside_the_block():
    cum, ema, off = torch.nn.BatchNorm2d(4, momentum=None), torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(
        4, momentum=None, track_running_stats=False)
    model = torch.nn.Sequential(cum, ema, off)
    assert cumulative_bn.cumulative(cum) and not cumulative_bn.cumulative(ema) and not cumulative_bn.cumulative(off)
    assert not cumulative_bn.cumulative(torch.nn.BatchNorm2d(4, momentum=None).eval())
    with cumulative_bn.traceable(model) as n:
        assert n == 1 and "forward" in vars(cum) and "forward" not in vars(ema)
    assert "forward" not in vars(cum)


def test_the_traceable_forward_computes_what_the_module_does_over_several_calls():
    torch.manual_seed(0)
    a = torch.nn.BatchNorm1d(6, momentum=None)
    b = torch.nn.BatchNorm1d(6, momentum=None)
    with cumulative_bn.traceable(b):
        for _ in range(4):
            x = torch.randn(5, 6, 7) * 3 + 1
            torch.testing.assert_close(b(x), a(x))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), msg=name)


def test_export_records_the_statistics_and_the_counter_as_buffer_updates():
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4, momentum=None)).train()
    graph = capture_module(model, [torch.randn(2, 3, 9)])
    assert sorted(graph.mutations.values()) == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
