"""Timing protocol: pure logic without a GPU; sanity of real timings on a GPU (marked, skipped)."""
from __future__ import annotations

import statistics
from collections import Counter

import pytest
import torch
from torch import nn

from kernelwright.measure import (L2Flusher, Timing, make_baselines, round_order, runs_for_budget,
                                  time_interleaved, time_problem)
from kernelwright.policy import get_policy
from kernelwright.problem import from_module

HAS_GPU = torch.cuda.is_available()


# ---------------------------------------------------------------- no GPU needed
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_round_order_balances_positions_and_predecessors(n):
    names = [chr(ord("a") + i) for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    rounds = [round_order(names, r) for r in range(cycle)]
    assert all(sorted(o) == names for o in rounds)
    assert rounds == [round_order(names, r + cycle) for r in range(cycle)]  # it repeats
    for pos in range(n):  # every name equally often in every position
        assert Counter(o[pos] for o in rounds) == Counter({x: cycle // n for x in names})
    # ... and right after every other name equally often (a rotation of one order is not:
    # there b always follows a)
    pairs = Counter((o[i], o[i + 1]) for o in rounds for i in range(n - 1))
    assert set(pairs) == {(a, b) for a in names for b in names if a != b}
    assert len(set(pairs.values())) == 1
    assert round_order([], 5) == [] and round_order(["a"], 3) == ["a"]


def test_timing_stats_from_samples():
    xs = [3.0, 1.0, 2.0, 10.0, 4.0]
    t = Timing.from_samples(xs)
    assert t.median_ms == 3.0 and t.mean_ms == 4.0 and t.min_ms == 1.0 and t.runs == 5
    assert t.std_ms == pytest.approx(statistics.stdev(xs))
    assert t.to_json() == {"median_ms": 3.0, "mean_ms": 4.0, "min_ms": 1.0, "std_ms": t.std_ms, "runs": 5,
                           "issue_ms": None}
    assert Timing.from_samples(xs, [0.5, 0.1, 0.2]).issue_ms == 0.2  # median host time per call
    assert Timing.from_samples([2.0]).std_ms == 0.0
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_runs_for_budget():
    assert runs_for_budget(0.001, 50, 1000, None) == 50
    assert runs_for_budget(0.001, 50, 1000, 0.2) == 200
    assert runs_for_budget(0.001, 50, 1000, 0.01) == 50  # never fewer than min_runs
    assert runs_for_budget(0.0001, 50, 1000, 10.0) == 1000


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_no_gpu_is_a_clear_error():
    problem = from_module(nn.Linear(4, 4), [torch.randn(2, 4)])
    for call in (
        lambda: time_interleaved({"a": lambda: None}),
        lambda: L2Flusher("cuda"),
        lambda: time_problem(problem, get_policy("fp32"), "cpu"),
    ):
        with pytest.raises(RuntimeError, match="timing needs a CUDA GPU"):
            call()


def test_cpu_device_is_refused_even_with_gpu():
    with pytest.raises(RuntimeError, match="timing needs a CUDA GPU"):
        time_interleaved({"a": lambda: None}, device="cpu")


def test_make_baselines_eager_only_on_cpu():
    problem = from_module(nn.Linear(4, 3), [torch.randn(2, 4)])
    base = make_baselines(problem, get_policy("fp32"), "cpu", include_compile=False)
    assert list(base) == ["eager"] and base.errors == {}
    assert base["eager"](torch.randn(2, 4)).shape == (2, 3)


def test_no_compile_baseline_inside_a_torch_compile_backend():
    # a torch.compile of the baseline there would reset Dynamo under the outer compile
    problem = from_module(nn.Linear(4, 3), [torch.randn(2, 4)])
    seen = {}

    def backend(gm, example_inputs):
        seen["base"] = make_baselines(problem, get_policy("fp32"), "cpu")
        return gm.forward

    torch.compile(lambda x: x.sin() + 1, backend=backend)(torch.randn(3))
    assert list(seen["base"]) == ["eager"] and "torch.compile backend" in seen["base"].errors["compile"]


def test_bf16_baselines_run_in_bf16_autocast():
    problem = from_module(nn.Linear(4, 3), [torch.randn(2, 4)])
    x = torch.randn(2, 4)
    assert make_baselines(problem, get_policy("fp32"), "cpu", include_compile=False)["eager"](x).dtype == torch.float32
    out = make_baselines(problem, get_policy("bf16"), "cpu", include_compile=False)["eager"](x)
    assert out.dtype == torch.bfloat16  # the Linear ran on bf16 operands, as a PyTorch user gets it
    assert not torch.is_autocast_enabled("cpu")  # only inside the call


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_l2_flusher_size():
    f = L2Flusher("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert f.nbytes >= 2 * (l2 or 60 * 2**20)
    f.flush()
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_time_copy_sanity():
    n = 64 * 2**20  # 256 MiB of float32 each way
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    small_dst = torch.empty(n // 16, device="cuda")
    res = time_interleaved(
        {"copy": lambda: dst.copy_(src), "copy_small": lambda: small_dst.copy_(src[: n // 16])},
        warmup_s=0.1,
    )
    big, small = res["copy"], res["copy_small"]
    assert big.runs >= 50 and small.runs >= 50
    assert 0 < big.min_ms <= big.median_ms and big.std_ms >= 0
    tbps = 2 * n * 4 / (big.median_ms * 1e-3) / 1e12
    assert 0.3 < tbps < 6.0, f"copy at {tbps:.2f} TB/s"  # H200 measures about 4.2
    assert big.median_ms > 4 * small.median_ms  # 16x the bytes takes clearly longer


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_device_only_timing_hides_the_hosts_launch_overhead():
    """A 10 us kernel behind 0.5 ms of host work: timed as it is, the events see the host's time;
    with device_only the stream is kept busy until the call is queued, and they see the kernel's."""
    import time as _time

    x = torch.randn(2**20, device="cuda")

    def slow_host():
        _time.sleep(0.0005)
        x.mul_(1.0)

    res = time_interleaved({"k": slow_host}, warmup_s=0.05, min_runs=20)["k"]
    dev = time_interleaved({"k": slow_host}, warmup_s=0.05, min_runs=20, device_only=True)["k"]
    assert res.median_ms > 0.4 and res.issue_ms > 0.4
    assert dev.median_ms < 0.1, dev


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_time_problem_interleaves_baselines_and_candidates():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU())
    problem = from_module(model, [torch.randn(256, 512)])

    def broken(x):
        raise RuntimeError("no kernel")

    ref = problem.make_model("cuda")
    res = time_problem(problem, get_policy("fp32"), "cuda",
                       candidates={"mine": lambda x: torch.relu(ref[0](x)), "broken": broken},
                       warmup_s=0.05, min_runs=50)
    assert set(res) >= {"eager", "mine"} and "broken" not in res
    assert "broken" in res.errors
    assert "compile" in res or "compile" in res.errors
    for t in res.values():
        assert t.runs >= 50 and t.median_ms > 0
        assert 0 < t.issue_ms < 50 * t.median_ms  # host time to issue one call, recorded too


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_first_sync_names_where_a_call_waits_for_the_gpu():
    from kernelwright.measure.baselines import first_sync

    x = torch.randn(1024, device="cuda")
    assert first_sync(lambda: torch.relu(x)) is None

    def waits():
        return torch.relu(x).sum().item()

    where = first_sync(waits)
    assert where is not None and "waits" in where
    assert torch.cuda.get_sync_debug_mode() == 0  # restored


def test_report_lists_each_implementations_kernels_per_call():
    from kernelwright.emit.report import render_report

    rows = [{"name": f"k{i}", "us_per_call": 100.0 - i, "launches_per_call": 1.0} for i in range(10)]
    result = {"problem": "p", "precision": "tf32", "device": "cuda", "capture": "ok", "groups": [],
              "timing": {"eager": {"median_ms": 1.0, "mean_ms": 1.0, "runs": 50, "issue_ms": 0.25},
                         "kernels_per_call": {"eager": rows[:2], "kernelwright": rows},
                         "syncs": {"kernelwright": "model_new.py:12 forward: synchronizing op"}}}
    text = render_report(result)
    assert "| eager | 1.000 | 1.000 | 50 | 0.250 |" in text
    assert "kernelwright makes the host wait for the GPU within a call, at model_new.py:12 forward" in text
    assert "## Kernels per call" in text
    assert "**eager**: 199.0 us in 2 launches" in text
    assert "| 100.0 | 1 | `k0` |" in text and "`k8`" not in text  # the 8 longest, then the rest summed
    assert "| 183.0 | 2 | (2 more kernels) |" in text
    assert "## Kernels per call" not in render_report(dict(result, timing={"eager": {"median_ms": 1.0}}))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_kernel_times_leave_out_the_l2_flush():
    from kernelwright.measure.profile import kernel_times

    x = torch.randn(1 << 20, device="cuda")
    rows = kernel_times(lambda: torch.relu(x), calls=5)
    assert sum(r.launches_per_call for r in rows) == pytest.approx(1.0)  # relu only, no flush fill
    assert all(r.us_per_call >= 0 for r in rows)


def test_the_compile_baseline_is_keyed_compile_in_any_mode():
    """bench and optimize read the compiled baseline under "compile" whichever torch.compile mode
    it runs in (the mode is named beside it, in the JSON options and result.json)."""
    import torch.nn as nn

    from kernelwright.measure.baselines import make_baselines
    from kernelwright.policy import get_policy
    from kernelwright.problem import from_module

    prob = from_module(nn.Sequential(nn.ReLU()), [torch.randn(2, 3)], "relu")
    for mode in ("default", "reduce-overhead"):
        base = make_baselines(prob, get_policy("fp32"), "cpu", compile_mode=mode)  # no inputs: nothing compiles yet
        assert set(base) == {"eager", "compile"} and not base.errors, mode
