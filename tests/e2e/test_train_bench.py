"""bench --train (kernelwright/bench/training.py) on the CPU: a problem trained under eager and
under torch.compile with kernelwright's backend (Triton interpreter) from the same weights, each
first step's loss and gradients checked against float64 eager, the loss curves compared."""
import json
from pathlib import Path

import pytest
import torch

from kernelwright.bench.training import LR, loss_of, run_train_bench, train_problem
from kernelwright.errors import UserError
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem


ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "problems" / "level2" / "gemm_bias_relu.py"


@pytest.fixture
def fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _kernelwright(model, device="cpu", **options):
    from kernelwright.backend import backend

    torch._dynamo.reset()
    return torch.compile(model, backend=backend(budget_trials=1, device=device, **options), dynamic=False)


def _off_by_a_percent(model):
    return lambda *xs: model(*xs) * 1.01


@pytest.mark.interpreter
def test_training_under_the_backend_matches_float64_eager_and_follows_eagers_losses(fresh_dynamo, tmp_path):
    problem = load_problem(PROBLEM, small=True)
    rows, summary = run_train_bench([PROBLEM], get_policy("fp32"), {"eager": lambda m: m, "kernelwright": _kernelwright},
                                    steps=4, timed=1, json_out=tmp_path / "train.json", echo=lambda s: None,
                                    small=True, device="cpu")
    (row,) = rows
    assert row["problem"] == problem.name and "error" not in row, row
    for name in ("eager", "kernelwright"):
        r = row["train"][name]
        assert r["correct"] and r["grad_excess"] <= get_policy("fp32").tol, (name, r)
        assert r["loss_drift"] < 1e-4 and r["step_ms"] is None and r["first_s"] >= 0  # no CUDA events on the CPU
        assert r["kernels"] is None  # nor a kernel profile
        assert len(r["losses"]) == 4 and r["losses"][-1] == r["last_loss"]  # the curve, one loss a step
    assert row["train"]["eager"]["loss_drift"] == 0.0 and row["correct"]
    # the backend's first step captures and optimises the forward and backward graphs
    assert row["train"]["kernelwright"]["first_s"] > row["train"]["eager"]["first_s"]
    assert json.loads((tmp_path / "train.json").read_text())["rows"][0]["train"]["kernelwright"]["correct"]
    assert summary["level2"]["correct"] == 1.0 and row["wall_s"] > 0
    # the backend optimised the forward and the backward graphs and verified both
    results = [json.loads(p.read_text()) for p in (tmp_path / "kernelwright" / "compiled").glob("*/result.json")]
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)


@pytest.mark.interpreter
def test_bf16_training_runs_in_autocast_and_the_backend_ships_both_graphs(fresh_dynamo, tmp_path):
    """Under the bf16 policy each step's forward runs in bf16 autocast, for eager as for the backend:
    the backend's graphs carry autocast's casts. Both graphs are optimised and pass verification
    against their float64 reference (the graph computed in float64, not rounded where the graph
    rounds), the backward for the dtypes a call really passes (the CPU batch norm returns its
    statistics of a bf16 input in float32, where its fake kernel says bf16): no graph runs as
    captured, and the first step's gradients are within bf16's tolerance of float64 eager."""
    import warnings

    problem = load_problem(ROOT / "problems" / "level3" / "resnet_basic_block.py", small=True)
    policy = get_policy("bf16")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        row = train_problem(problem, policy, {"eager": lambda m: m, "kernelwright": lambda m: _kernelwright(m, precision="bf16")},
                            steps=2, timed=1, device="cpu")
    assert row["correct"], row["train"]
    assert row["train"]["eager"]["grad_excess"] > 0  # (autocast rounded eager: it ran in bf16)
    assert not [str(w.message) for w in seen if "kernelwright" in str(w.message)]
    results = [json.loads(p.read_text()) for p in (tmp_path / "kernelwright" / "compiled").glob("*/result.json")]
    assert len(results) >= 2 and all(r["verify"]["passed"] for r in results)


@pytest.mark.interpreter
def test_a_wrong_implementation_fails_its_first_step_check():
    row = train_problem(load_problem(PROBLEM, small=True), get_policy("fp32"),
                        {"eager": lambda m: m, "wrong": _off_by_a_percent}, steps=3, timed=1, device="cpu")
    assert row["train"]["eager"]["correct"] and not row["train"]["wrong"]["correct"]
    assert row["train"]["wrong"]["grad_excess"] > get_policy("fp32").tol and not row["correct"]
    assert row["train"]["wrong"]["loss_drift"] > 0.01  # a 1% larger output: a 2% larger mean square


@pytest.mark.interpreter
def test_the_sgd_step_trains_the_copy_not_the_problems_model():
    """Each implementation trains its own copy: the second starts from the first's initial weights."""
    problem = load_problem(PROBLEM, small=True)
    row = train_problem(problem, get_policy("fp32"), {"a": lambda m: m, "b": lambda m: m}, steps=3, timed=1,
                        device="cpu")
    assert row["train"]["a"]["last_loss"] == row["train"]["b"]["last_loss"]
    assert row["train"]["b"]["loss_drift"] == 0.0 and LR > 0


@pytest.mark.interpreter
def test_loss_and_argument_errors_are_one_line_user_errors():
    with pytest.raises(UserError, match="no floating tensor"):
        loss_of(torch.tensor([1, 2]))
    problem = load_problem(PROBLEM, small=True)
    with pytest.raises(UserError, match="steps >= 2"):
        train_problem(problem, get_policy("fp32"), {"eager": lambda m: m}, steps=1, timed=1, device="cpu")
    relu = load_problem(ROOT / "problems" / "level1" / "relu.py", small=True)
    with pytest.raises(UserError, match="no parameters to train"):
        train_problem(relu, get_policy("fp32"), {"eager": lambda m: m}, steps=3, timed=1, device="cpu")
    rows, _ = run_train_bench([ROOT / "problems" / "level1" / "relu.py"], get_policy("fp32"), {"eager": lambda m: m},
                              steps=3, timed=1, json_out=None, echo=lambda s: None, small=True, device="cpu")
    assert rows[0]["error"].startswith("UserError: relu: the model has no parameters") and not rows[0]["correct"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_each_implementation_reports_the_kernels_of_a_step():
    problem = load_problem(PROBLEM, small=True)
    row = train_problem(problem, get_policy("fp32"), {"eager": lambda m: m}, steps=3, timed=1, device="cuda")
    kernels = row["train"]["eager"]["kernels"]
    assert kernels and all(len(k) == 3 and k[1] >= 0 and k[2] > 0 for k in kernels)
    assert any("gemm" in k[0].lower() or "sgemm" in k[0].lower() or "cutlass" in k[0].lower() for k in kernels)
    assert [k[1] for k in kernels] == sorted((k[1] for k in kernels), reverse=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_backends_training_graphs_are_both_captured(fresh_dynamo, tmp_path):
    # AOTAutograd's backward of a batch norm + ReLU makes a scalar tensor on the GPU: the capture's
    # meta-device trace fails on it and traces again on that GPU, so the graph is optimised
    problem = load_problem(ROOT / "problems" / "level3" / "resnet_basic_block.py", small=True)
    model = problem.make_model("cuda")
    x = problem.make_inputs(0, "cuda")[0]
    loss_of(_kernelwright(model, "cuda")(x)).backward()
    results = [json.loads(p.read_text()) for p in (tmp_path / "kernelwright" / "compiled").glob("*/result.json")]
    assert len(results) == 2  # forward and backward
    assert all(m["capture"] == "ok" for r in results for m in r["modes"].values()), [r["modes"] for r in results]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dynamic", [False, True])
def test_on_a_gpu_tf32_training_saves_channels_last_tensors_and_its_gradients_match(fresh_dynamo, tmp_path, dynamic):
    """Under tf32 the ResNet block's convolutions run channels-last; with static sizes the forward
    saves their results in that layout (reported to AOTAutograd), and either way the gradients of
    two steps match float64 eager within the policy's tolerance."""
    from kernelwright.backend import backend

    problem = load_problem(ROOT / "problems" / "level3" / "resnet_basic_block.py", small=True)
    model = problem.make_model("cuda").train()
    ref = problem.make_model("cuda").train().double()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend=backend(precision="tf32", budget_trials=1), dynamic=dynamic)
    for step in range(2):
        x = problem.make_inputs(step, "cuda")[0]
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        with get_policy("tf32").active():
            loss_of(compiled(x)).backward()
        loss_of(ref(x.double())).backward()
        for (name, a), b in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad.double(), b.grad, rtol=2e-2, atol=2e-3 * b.grad.abs().max().item(), msg=name)
    results = [json.loads(p.read_text()) for p in (tmp_path / "kernelwright" / "compiled").glob("*/result.json")]
    assert results and all(r["verify"]["passed"] for r in results)
    notes = [n for r in results for n in r["rewrites"]]
    assert any("convolution gradients run channels-last" in n for n in notes)
    if not dynamic:  # the second convolution reads the saved value itself, no channels-last copy of it
        assert any(n.startswith("convolution_1") and "run channels-last (relu," in n for n in notes), notes
