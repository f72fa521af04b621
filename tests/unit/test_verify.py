"""Verification protocol: excess math, float64 reference, eager floor, anti-cheat fixtures."""
from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from kernelwright.policy import get_policy
from kernelwright.problem import from_module
from kernelwright.verify import anticheat, excess, excess_reason, poisoned_like, verify


def _load_cheats():
    path = Path(__file__).parents[1] / "fixtures" / "cheats.py"
    spec = importlib.util.spec_from_file_location("kw_test_cheats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cheats = _load_cheats()
FP32 = get_policy("fp32")
DEVICE = "cpu"


def tiny_problem():
    torch.manual_seed(0)
    return from_module(cheats.Tiny(), [torch.randn(4, 16)], name="tiny")


# ---------------------------------------------------------------- excess math
def test_excess_value():
    ref = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    out = torch.tensor([1.5, -2.0, 0.1])
    # |d| - tol|ref| = [0.5 - 0.1, 0 - 0.2, 0.1 - 0]
    assert excess(out, ref, 0.1) == pytest.approx(0.4)
    assert excess(ref.float(), ref, 0.1) == pytest.approx(0.0)  # max(-0.1, -0.2, 0)


def test_excess_negative_inside_tolerance():
    ref = torch.tensor([10.0, 20.0], dtype=torch.float64)
    assert excess(ref.float(), ref, 1e-2) == pytest.approx(-0.1)


def test_excess_is_float64():
    ref = torch.tensor([1e8 + 1.0], dtype=torch.float64)
    out = torch.tensor([1e8], dtype=torch.float32)  # float32 cannot hold 1e8 + 1
    assert excess(out, ref, 0.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "out, ref, ok",
    [
        ([float("nan"), 1.0], [float("nan"), 1.0], True),
        ([float("inf"), 1.0], [float("inf"), 1.0], True),
        ([1.0, 1.0], [float("nan"), 1.0], False),
        ([float("-inf"), 1.0], [float("inf"), 1.0], False),
        ([float("nan"), 1.0], [2.0, 1.0], False),
        ([float("inf"), 1.0], [2.0, 1.0], False),
    ],
)
def test_excess_nonfinite(out, ref, ok):
    x, reason = excess_reason(torch.tensor(out), torch.tensor(ref, dtype=torch.float64), 1e-4)
    if ok:
        assert math.isfinite(x) and reason is None
    else:
        assert x == math.inf and "NaN/Inf mismatch" in reason


def test_excess_shape_and_dtype_mismatch():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    x, reason = excess_reason(torch.zeros(3, 2), ref, 1e-4)
    assert x == math.inf and "shape mismatch" in reason
    x, reason = excess_reason(torch.zeros(2, 3, dtype=torch.float16), ref, 1e-4, dtype=torch.float32)
    assert x == math.inf and "dtype mismatch" in reason
    x, reason = excess_reason(torch.zeros(2, 3, dtype=torch.int64), ref, 1e-4)
    assert x == math.inf and "dtype mismatch" in reason
    assert excess(torch.zeros(2, 3), ref, 1e-4) == pytest.approx(0.0)  # float32 vs float64 ref is fine


def test_poisoned_like():
    f = poisoned_like(torch.zeros(3, 4).t())
    assert f.shape == (4, 3) and f.stride() == (1, 4) and torch.isnan(f).all()
    i = poisoned_like(torch.zeros(5, dtype=torch.int32))
    assert (i == torch.iinfo(torch.int32).max).all()
    assert poisoned_like(torch.zeros(2, dtype=torch.bool)).all()
    # a kernel that leaves elements unwritten in a poisoned buffer fails the comparison
    ref = torch.arange(6, dtype=torch.float64)
    buf = poisoned_like(ref.float())
    buf[:5] = ref[:5].float()
    x, reason = excess_reason(buf, ref, 1e-4)
    assert x == math.inf and "1 non-finite" in reason


# ---------------------------------------------------------------- protocol
def test_honest_candidate_passes():
    r = verify(tiny_problem(), cheats.honest_factory, FP32, DEVICE)
    assert r.passed, r.reason
    assert r.reason is None and r.failed_check is None
    assert r.reference_dtype == "float64"
    assert len(r.sets) >= 5 and len({s.seed for s in r.sets}) == len(r.sets)
    assert r.threshold == pytest.approx(1e-4) and r.excess <= r.threshold
    assert r.checks["other_streams"].startswith("skipped")
    assert all(v == "ok" for k, v in r.checks.items() if k != "other_streams")
    json.dumps(r.to_json(), allow_nan=False)


def test_wrong_candidate_fails_with_excess():
    r = verify(tiny_problem(), cheats.wrong_factory, FP32, DEVICE)
    assert not r.passed and r.failed_check == "excess"
    # 1e-2 off on values of magnitude <= 2: excess between 1e-2 - 2e-4 and 1e-2
    assert 0.0097 < r.excess <= 0.0101
    assert "excess" in r.reason and "threshold" in r.reason


def test_raising_candidate_is_a_result():
    r = verify(tiny_problem(), cheats.raises_factory, FP32, DEVICE)
    assert not r.passed and r.failed_check == "exception"
    assert r.reason == "candidate raised ValueError: kernel launch failed"


def test_failing_build_is_a_result():
    def factory(reference):
        raise KeyError("missing kernel")
    r = verify(tiny_problem(), factory, FP32, DEVICE)
    assert not r.passed and r.failed_check == "build" and "KeyError" in r.reason


def test_wrong_output_count_and_shape():
    r = verify(tiny_problem(), lambda ref: (lambda x: (ref.lin(x), ref.lin(x))), FP32, DEVICE)
    assert not r.passed and r.failed_check == "outputs" and "2 output(s), expected 1" in r.reason
    new = cheats.honest_factory
    r = verify(tiny_problem(), lambda ref: (lambda x, m=new(ref): m(x)[:, :4]), FP32, DEVICE)
    assert not r.passed and r.failed_check == "excess" and "shape mismatch" in r.reason and r.excess == math.inf


def test_unwritten_output_fails():
    """A candidate that leaves part of a fresh output unwritten must not pass by reusing stale memory."""
    def factory(reference):
        m = cheats.honest_factory(reference)

        def run(x):
            y = m(x)
            out = torch.empty_like(y)
            out[:, :7] = y[:, :7]  # last column never written
            return out
        return run
    r = verify(tiny_problem(), factory, FP32, DEVICE)
    assert not r.passed


@pytest.mark.parametrize("name", sorted(cheats.CHEATS))
def test_cheat_rejected(name):
    factory, check = cheats.CHEATS[name]
    if name == "side_stream" and not torch.cuda.is_available():
        pytest.skip("work on other streams needs CUDA streams; on the CPU this check is a no-op")
    device = "cuda" if name == "side_stream" else DEVICE
    torch.manual_seed(0)
    problem = from_module(cheats.Tiny(), [torch.randn(4, 16)], name="tiny")
    r = verify(problem, factory, FP32, device)
    assert not r.passed, name
    assert r.failed_check == check, (name, r.failed_check, r.reason)
    assert r.checks[check] == r.reason and "\n" not in r.reason
    if name == "patches_timer":
        assert time.perf_counter is anticheat.ORIGINAL_TIMERS["time.perf_counter"]  # restored
        assert "time.perf_counter" in r.reason


@pytest.mark.parametrize("name", ["honest", "wrong"] + sorted(set(cheats.CHEATS) - {"side_stream"}))
def test_large_inputs_and_outputs_are_drawn_again_and_fingerprinted(name, monkeypatch):
    """With every input set counted as large (drawn again from its seed for each use) and every
    output as too large to copy (fingerprinted), verification reaches the same verdicts."""
    from kernelwright.verify import verifier

    monkeypatch.setattr(verifier, "LARGE_INPUTS", 0)
    monkeypatch.setattr(anticheat, "SNAPSHOT_LIMIT", 0)
    factory, check = {"honest": (cheats.honest_factory, None), "wrong": (cheats.wrong_factory, "excess")}.get(
        name) or cheats.CHEATS[name]
    torch.manual_seed(0)
    r = verify(from_module(cheats.Tiny(), [torch.randn(4, 16)], name="tiny"), factory, FP32, DEVICE)
    assert r.passed == (check is None) and r.failed_check == check, (name, r.reason)


def test_reference_forward_restored_after_verify():
    problem = tiny_problem()
    seen = {}

    def factory(reference):
        seen["ref"] = reference
        return cheats.reference_fallback_factory(reference)
    verify(problem, factory, FP32, DEVICE)
    x = torch.randn(2, 16)
    assert "forward" not in seen["ref"].__dict__
    assert seen["ref"](x).shape == (2, 8)
    assert cheats.Tiny.forward.__name__ == "forward"


def test_reference_mutating_inputs_allows_candidate_to_do_the_same():
    class InPlace(nn.Module):
        def forward(self, x):
            return x.mul_(2).sum(-1)

    problem = from_module(InPlace(), [torch.randn(3, 5)])

    def factory(reference):
        return lambda x: x.mul_(2).sum(-1)
    r = verify(problem, factory, FP32, DEVICE)
    assert r.passed, r.reason


def test_view_returning_model_may_alias_input():
    class View(nn.Module):
        def forward(self, x):
            return x.view(-1)

    problem = from_module(View(), [torch.randn(3, 5)])
    r = verify(problem, lambda ref: (lambda x: x.reshape(-1)), FP32, DEVICE)
    assert r.passed, r.reason


def test_tuple_outputs_compared_each():
    class Two(nn.Module):
        def forward(self, x):
            return x.sin(), x.cos()

    problem = from_module(Two(), [torch.randn(4, 4)])
    assert verify(problem, lambda ref: (lambda x: (torch.sin(x), torch.cos(x))), FP32, DEVICE).passed
    r = verify(problem, lambda ref: (lambda x: (torch.sin(x), torch.cos(x) + 1e-3)), FP32, DEVICE)
    assert not r.passed and r.reason.startswith("output 1")
    assert r.thresholds == [pytest.approx(1e-4), pytest.approx(1e-4)]


class BigSum(nn.Module):
    """Large offset summed over 4096 elements: eager float32 misses 1e-4 badly."""

    def forward(self, x):
        return (x + 1e4).sum(-1) - 1e4 * x.shape[-1]


def test_eager_floor_lets_equally_good_candidate_pass():
    problem = from_module(BigSum(), [torch.randn(4, 4096)])
    r = verify(problem, lambda ref: (lambda x: torch.sum(x + 1e4, dim=-1) - 1e4 * x.shape[-1]), FP32, DEVICE)
    assert r.eager_excess > 1e-4  # eager itself misses the tolerance against the float64 reference
    assert r.threshold == pytest.approx(4 * r.eager_excess)
    assert r.passed, r.reason
    # the floor is not a free pass: something 100x worse than eager still fails
    worse = 100 * r.eager_excess
    bad = verify(problem, lambda ref: (lambda x: torch.sum(x + 1e4, dim=-1) - 1e4 * x.shape[-1] + worse), FP32, DEVICE)
    assert not bad.passed and bad.failed_check == "excess"


class Drop(nn.Module):
    """Dropout in training mode: a random model."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x)))


def test_random_models_are_compared_from_the_same_random_state():
    """Each call of a set starts from the same seed: a candidate that draws as the model does
    matches eager within the plain tolerance (no floor from eager's own randomness); one that
    draws differently fails instead of passing under a threshold inflated by that randomness."""
    problem = from_module(Drop().train(), [torch.randn(8, 16)])

    def same(ref):
        return lambda x: F.dropout(torch.relu(F.linear(x, ref.fc.weight, ref.fc.bias)), 0.5, True)

    def other(ref):  # an extra draw first: a different mask
        return lambda x: (torch.rand(1), F.dropout(torch.relu(F.linear(x, ref.fc.weight, ref.fc.bias)), 0.5, True))[1]

    r = verify(problem, same, FP32, DEVICE)
    assert r.passed, r.reason
    assert r.eager_excess <= 1e-4 and r.threshold == pytest.approx(1e-4)
    bad = verify(problem, other, FP32, DEVICE)
    assert not bad.passed and bad.failed_check == "excess"


def test_float32_reference_when_float64_unsupported():
    class F32Only(nn.Module):
        def forward(self, x):
            return x @ torch.ones(16, 4, dtype=torch.float32, device=x.device)

    problem = from_module(F32Only(), [torch.randn(4, 16)])
    r = verify(problem, lambda ref: (lambda x: torch.mm(x, torch.ones(16, 4))), FP32, DEVICE)
    assert r.reference_dtype == "float32"
    assert r.passed, r.reason


def test_a_float64_reference_not_finite_where_the_model_is_gives_way_to_float32():
    """A model whose float64 path overflows where its float32 one does not (as a library op's
    float64 fallback can): the float32 reference is used, and an honest candidate passes."""
    class Overflows64(nn.Module):
        def forward(self, x):
            y = x * 2
            if x.dtype == torch.float64:  # its float64 path overflows on one row
                y[0] = math.inf
            return y

    problem = from_module(Overflows64(), [torch.randn(4, 8)])
    r = verify(problem, lambda ref: (lambda x: x * 2), FP32, DEVICE)
    assert r.reference_dtype == "float32" and "not finite where the model is" in r.reference_fallback
    assert r.passed, r.reason


def test_an_output_eager_itself_does_not_reproduce_is_not_held_to_change():
    """An output that is no function of the inputs (eager misses the reference by far more than
    any tolerance, as with uninitialised memory): a candidate returning a fixed value there passes
    the constant-output check; the other outputs are still held to it."""
    import random

    class Garbage(nn.Module):
        def forward(self, x):
            return x * 2, torch.full((2,), random.random() * 1e12, dtype=x.dtype)

    random.seed(0)
    problem = from_module(Garbage(), [torch.randn(4, 8)])
    fixed = torch.full((2,), 5e11)
    r = verify(problem, lambda ref: (lambda x: (x * 2, fixed.clone())), FP32, DEVICE)
    assert r.passed, r.reason
    r = verify(problem, lambda ref: (lambda x: (torch.ones_like(x), fixed.clone())), FP32, DEVICE)
    assert not r.passed and r.failed_check in ("constant_outputs", "excess")


def test_a_reference_output_moving_by_rounding_alone_is_not_a_change_a_constant_candidate_must_follow():
    """A bf16 output of two values in a narrow range (a log-sum-exp over 16 sigmoids): between two
    input sets the reference moved one value by one unit in the last place, a more accurate
    candidate rounded both sets to the same values; that is no constant output. A reference that
    moves by more than rounding still holds the candidate to it, in any dtype."""
    ulp = 2.0 ** -6  # bf16's spacing at 2.84
    ref_a = torch.tensor([2.84375, 2.84375], dtype=torch.bfloat16)
    ref_b = torch.tensor([2.84375, 2.84375 - ulp], dtype=torch.bfloat16)
    cand = torch.tensor([2.828125, 2.84375], dtype=torch.bfloat16)
    assert anticheat.check_constant_outputs([ref_a], [ref_b], [cand], [cand.clone()]) is None
    far = torch.tensor([2.84375, 2.75], dtype=torch.bfloat16)
    assert "constant output: output 0" in anticheat.check_constant_outputs([ref_a], [far], [cand], [cand.clone()])
    x = torch.tensor([1.0, 2.0])
    for moved in (x + 1e-3, torch.tensor([1.0, float("inf")]), torch.tensor([1.0, float("nan")])):
        assert anticheat.check_constant_outputs([x], [moved], [x], [x.clone()]) is not None
    ints = torch.tensor([1, 2])
    assert anticheat.check_constant_outputs([ints], [ints + 1], [ints], [ints.clone()]) is not None


def test_float64_reference_is_used():
    """Against a float32 reference running the same ops eager's error would be <= 0; against the
    float64 reference BigSum's float32 rounding shows up."""
    problem = from_module(BigSum(), [torch.randn(4, 4096)])
    r = verify(problem, lambda ref: (lambda x: torch.sum(x + 1e4, dim=-1) - 1e4 * x.shape[-1]), FP32, DEVICE)
    assert r.reference_dtype == "float64"
    assert all(s.eager_excess > 0 for s in r.sets)


def test_bf16_policy_threshold():
    r = verify(tiny_problem(), cheats.wrong_factory, get_policy("bf16"), DEVICE)
    assert r.passed and r.threshold >= 1e-2  # 1e-2 off is within bf16's tolerance
    # eager ran in bf16 autocast: its own error is bf16's, far above float32's
    r32 = verify(tiny_problem(), cheats.honest_factory, FP32, DEVICE)
    assert r.eager_excess > r32.eager_excess + 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["honest", "wrong"] + sorted(cheats.CHEATS))
def test_on_gpu(name):
    torch.manual_seed(0)
    problem = from_module(cheats.Tiny(), [torch.randn(4, 16)], name="tiny")
    if name in ("honest", "wrong"):
        r = verify(problem, getattr(cheats, f"{name}_factory"), FP32, "cuda")
        assert r.passed == (name == "honest"), r.reason
        assert r.checks["other_streams"] == "ok" or name == "wrong"
        return
    factory, check = cheats.CHEATS[name]
    r = verify(problem, factory, FP32, "cuda")
    assert not r.passed and r.failed_check == check, (name, r.reason)


def test_large_input_sets_keep_the_float64_reference(monkeypatch):
    """Large input sets are drawn again for each use and checked against the first draw's
    fingerprints: the float64 reference draws them as get_inputs does (float32) and upcasts, so
    the check holds and the reference stays float64."""
    from kernelwright.problem import load_problem
    from kernelwright.verify import verifier

    monkeypatch.setattr(verifier, "LARGE_INPUTS", 0)
    problem = load_problem(Path(__file__).parents[2] / "problems/level1/l1_norm.py", small=True)
    def factory(reference):  # the problem's forward, written out
        return lambda x: x / x.abs().sum(dim=1, keepdim=True)
    r = verify(problem, factory, FP32, DEVICE)
    assert r.passed, r.reason
    assert r.reference_dtype == "float64" and r.reference_fallback is None


def test_a_parked_reference_compares_like_one_in_place(monkeypatch):
    from kernelwright.verify import compare

    monkeypatch.setattr(compare, "PARK_BYTES", 0)
    ref = torch.randn(1000, dtype=torch.float64)
    out = (ref + 1e-3).float()
    assert compare.park(ref) is ref or torch.equal(compare.park(ref), ref)
    assert excess(out, compare.park(ref), 1e-4) == excess(out, ref, 1e-4)


def test_large_references_leave_the_gpu_only_when_memory_is_short():
    """A float64 reference of a large convolution's output (1.6 GiB) stays on a GPU with 130 GiB
    free (its copies to host and back cost seconds); one taking over an eighth of the free memory,
    or any reference on a nearly full GPU, waits in host memory; small ones never move."""
    from kernelwright.verify.compare import PARK_BYTES, parks

    gib = 1 << 30
    assert not parks(int(1.6 * gib), 130 * gib)
    assert parks(20 * gib, 100 * gib) and parks(int(1.6 * gib), 4 * gib)
    assert not parks(PARK_BYTES - 1, 0)


def test_a_rounded_reference_keeps_every_excess_within_its_rounding(monkeypatch):
    """A large float64 reference rounded to float32 (compare.rounded_reference, in chunks): each
    excess moves by at most 2^-24 |ref|, far below any tolerance; NaN and infinities stay; memory
    order stays; a finite value past float32's range, or a tensor with gaps, is not rounded."""
    from kernelwright.verify import compare

    monkeypatch.setattr(compare, "CHUNK", 1000)  # several chunks
    torch.manual_seed(0)
    ref = (torch.randn(5, 7, 11, 13, dtype=torch.float64) * 1e3).contiguous(memory_format=torch.channels_last)
    ref[0, 0, 0, 0], ref[1, 2, 3, 4], ref[4, 6, 10, 12] = float("nan"), float("inf"), 1e-300
    narrow = compare.rounded_reference(ref)
    assert narrow.dtype == torch.float32 and narrow.stride() == ref.stride()
    assert narrow[0, 0, 0, 0].isnan() and narrow[1, 2, 3, 4] == float("inf")
    finite = ref.isfinite()
    assert ((narrow.double() - ref)[finite].abs() <= 2.0 ** -24 * ref[finite].abs() + 1e-45).all()
    out = (ref * (1 + 1e-5)).float()
    out[0, 0, 0, 0] = float("nan")
    out[1, 2, 3, 4] = float("inf")
    for tol in (1e-4, 1e-2):
        a, b = excess(out, ref, tol), excess(out, narrow, tol)
        assert abs(a - b) <= 2.0 ** -24 * ref[finite].abs().max() and b <= tol
    assert excess(out + 1.0, narrow, 1e-4) > 1e-4  # (still catches an error)
    big = ref.clone()
    big[2, 2, 2, 2] = 1e39  # finite in float64, infinite in float32
    assert compare.rounded_reference(big) is None
    assert compare.rounded_reference(ref[:, :, ::2]) is None  # gaps: left to the float64 path
