"""ModelNew as users call it: in train() and eval() (non-trivial running statistics), at another
batch size, with gradients on, in another dtype, with arguments by keyword, under the caller's
autocast, and with submodules in mixed modes. Calls unlike the specialised one run the original
forward (one warning per reason); each mode whose graph differs has its own generated forward."""
import copy
import io
import os
import warnings

import pytest
import torch
import torch.nn as nn

from kernelwright.capture.modes import mode_modules, reads_training
from kernelwright.emit.module import import_model_new
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem
from kernelwright.problem.load import running_statistics
from kernelwright.verify import verify

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "modes")
pytestmark = pytest.mark.interpreter


# --- which modules depend on the mode -----------------------------------------------------------

class _Branchy(nn.Module):
    """Mentions training in its docstring only."""

    def forward(self, x):
        return x + 1


class _Branching(nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x


def test_mode_modules_finds_norms_dropout_and_training_branches():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.1), _Branchy(), _Branching(),
                          nn.LayerNorm(4))
    assert mode_modules(model) == ["1", "3", "5"]
    assert not reads_training(nn.Sequential) and not reads_training(nn.LayerNorm) and reads_training(nn.LSTM)


def test_running_statistics_are_drawn_not_trivial():
    m = nn.BatchNorm2d(5)
    running_statistics(m, 0)
    assert m.running_mean.abs().sum() > 0 and (m.running_var != 1).all() and (m.running_var > 0).all()


# --- one KernelBench problem, optimized once ------------------------------------------------------

@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("modes")
    problem = load_problem(os.path.join(FIX, "conv_bn_dropout.py"))
    result = optimize_problem(problem, out, Options(budget_trials=2, device="cpu", log=lambda s: None))
    return problem, result, import_model_new(out / "model_new.py"), out


def _pair(problem, mod, training=True):
    ref = problem.in_mode(training).make_model()
    new = mod.ModelNew(*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    return ref, new.train(training)


def _kw_warnings(caught):
    return [str(w.message) for w in caught if "kernelwright" in str(w.message)]


def _same(fn_ref, fn_new, seed=1):
    torch.manual_seed(seed)
    a = fn_ref()
    torch.manual_seed(seed)
    b = fn_new()
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    return a, b


def test_both_modes_are_generated_and_verified(emitted):
    _, result, _, out = emitted
    assert set(result["modes"]) == {"train", "eval"} and result["mode"] == "train"
    assert result["mode_modules"] == ["", "bn", "drop"]
    for mode in ("train", "eval"):
        r = result["modes"][mode]
        assert r["verify"]["passed"] and "verify_fallback" not in r, (mode, r["verify"])
    text = (out / "model_new.py").read_text()
    # train mode updates the running statistics: its forward is emitted as compute and commit
    assert "def _kw_compute_train(" in text and "def _kw_commit_train(" in text and "def _kw_forward_eval(" in text
    names = {p.name for p in (out / "kernels").glob("*.py")}
    assert any(n.startswith("train_") for n in names) and any(n.startswith("eval_") for n in names)


def test_eval_mode_runs_its_own_generated_forward(emitted):
    problem, _, mod, _ = emitted
    ref, new = _pair(problem, mod, training=False)
    assert ref.bn.running_var.ne(1).all()  # non-trivial statistics, shared through the state_dict
    x = problem.make_inputs(3)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        _same(lambda: ref(*x), lambda: new(*x))
    assert _kw_warnings(caught) == []


def test_train_mode_matches_draw_for_draw_and_updates_running_statistics(emitted):
    problem, _, mod, _ = emitted
    ref, new = _pair(problem, mod, training=True)
    x = problem.make_inputs(4)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        _same(lambda: ref(*x), lambda: new(*x))
    assert _kw_warnings(caught) == []
    torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean)
    torch.testing.assert_close(new.bn.running_var, ref.bn.running_var)
    assert int(new.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 1


def test_another_batch_size_runs_the_original_forward_and_warns_once(emitted):
    problem, _, mod, _ = emitted
    for training in (True, False):
        ref, new = _pair(problem, mod, training)
        x = [torch.randn(5, 3, 9, 7)]
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            _same(lambda: ref(*x), lambda: new(*x))
            _same(lambda: ref(*x), lambda: new(*x), seed=2)
        assert len(_kw_warnings(caught)) <= 1 and "original forward" in " ".join(_kw_warnings(caught)) + \
            " ".join(mod._KW_WARNED) or mod._KW_WARNED


def test_gradients_are_eager_gradients(emitted):
    problem, _, mod, _ = emitted
    ref, new = _pair(problem, mod, training=True)
    x = problem.make_inputs(5)[0]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = _same(lambda: ref(xa), lambda: new(xb))
    w = torch.randn_like(a)
    (a * w).sum().backward()
    (b * w).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad)
    for (name, pa), pb in zip(ref.named_parameters(), new.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, msg=name)
    # parameters requiring grad alone (inputs do not) also take the original forward
    new.zero_grad()
    out = new(x)
    assert out.grad_fn is not None


def test_other_dtypes_keyword_arguments_autocast_and_mixed_modes_take_the_original_forward(emitted):
    problem, _, mod, _ = emitted
    ref, new = _pair(problem, mod, training=False)
    x = problem.make_inputs(6)
    with torch.no_grad():
        _same(lambda: ref(*x, scale=3.0), lambda: new(*x, scale=3.0))  # (bound by position: 2 arguments)
        _same(lambda: ref(*x, 3.0), lambda: new(*x, 3.0))  # the optional argument given by position
        _same(lambda: ref(x=x[0]), lambda: new(x=x[0]))  # the specialised call, by keyword
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _same(lambda: ref(*x), lambda: new(*x))
        ref.train(), new.train()
        ref.bn.eval(), new.bn.eval()  # a frozen BatchNorm while the rest trains
        _same(lambda: ref(*x), lambda: new(*x))
        ref.double(), new.double()
        _same(lambda: ref(x[0].double()), lambda: new(x[0].double()))
    assert any("mixed mode" in w for w in mod._KW_WARNED)
    assert any("2 positional arguments" in w for w in mod._KW_WARNED) and any("autocast" in w for w in mod._KW_WARNED)
    assert not any("keyword" in w for w in mod._KW_WARNED)


def test_noncontiguous_input_of_the_same_shape_is_not_the_specialised_call(emitted):
    problem, _, mod, _ = emitted
    ref, new = _pair(problem, mod, training=False)
    x = torch.randn(2, 3, 7, 9).transpose(2, 3)
    with torch.no_grad():
        _same(lambda: ref(x), lambda: new(x))


# --- the Python API: the live module's mode, pickling, copies -----------------------------------

def test_api_module_in_eval_mode_pickles_and_copies(tmp_path):
    import kernelwright

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5)).eval()
    running_statistics(model, 3)
    x = torch.randn(4, 8)
    with torch.no_grad():
        want = model(x)
    fast = kernelwright.optimize(model, [x], tmp_path / "api", budget_trials=2, device="cpu")
    result = __import__("json").loads((tmp_path / "api" / "result.json").read_text())
    assert set(result["modes"]) == {"eval"} and result["untuned_modes"] == ["train"]
    with torch.no_grad():
        torch.testing.assert_close(fast(x), want)
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        torch.testing.assert_close(back(x), want)  # its own class's forward after unpickling
        twin = copy.deepcopy(fast)
        assert "forward" in twin.__dict__  # a copy keeps kernelwright's forward
        torch.testing.assert_close(twin(x), want)
        fast.train()  # the mode without a generated forward: the module's own (dropout active)
        torch.manual_seed(1)
        got = fast(x)
        model_ref = copy.deepcopy(back).train()
        torch.manual_seed(1)
        torch.testing.assert_close(got, model_ref(x))


def test_a_forward_that_reads_tensor_values_keeps_the_original_with_the_reason(tmp_path):
    problem = load_problem(os.path.join(FIX, "item_branch.py"))
    result = optimize_problem(problem, tmp_path, Options(budget_trials=2, device="cpu", log=lambda s: None))
    assert "tensor values" in result["capture"] and "meta" not in result["capture"]
    assert result["verify"]["passed"]
    mod = import_model_new(tmp_path / "model_new.py")
    new, ref = mod.ModelNew(), problem.make_model()
    for x in (torch.randn(3, 8) + 5, torch.randn(3, 8) - 5):  # both branches
        torch.testing.assert_close(new(x), ref(x))


# --- buffers updated in forward -------------------------------------------------------------------

class _Ema(nn.Module):
    """ema_buffer.py's model written again (the verifier refuses candidates that call the problem's own
    forward); `off` is added to the stored average, after the output is computed from the right one."""

    def __init__(self, off=0.0):
        super().__init__()
        self.register_buffer("ema", torch.zeros(16))
        self.off = off

    def forward(self, x):
        new = 0.9 * self.ema + 0.1 * x.mean(0)
        self.ema.copy_(new + self.off)
        return torch.tanh(x - new)


def test_a_forward_that_updates_a_buffer_verifies_from_the_same_state():
    """Called three times a set against the reference's once, an honest candidate starts each call
    from the reference's state and passes; one whose output is right but whose buffer is not fails."""
    problem = load_problem(os.path.join(FIX, "ema_buffer.py"))

    def build(off):
        def factory(reference):
            m = _Ema(off)
            m.load_state_dict(reference.state_dict())
            return m
        return factory

    policy = get_policy("fp32")
    assert verify(problem, build(0.0), policy, "cpu").passed
    bad = verify(problem, build(1.0), policy, "cpu")
    assert not bad.passed and bad.failed_check == "excess" and "output 1" in bad.reason


def test_ema_problem_optimizes_and_passes(tmp_path):
    problem = load_problem(os.path.join(FIX, "ema_buffer.py"))
    result = optimize_problem(problem, tmp_path, Options(budget_trials=2, device="cpu", log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]


def test_a_cumulative_batch_norm_is_generated_and_its_counter_restored(tmp_path):
    """BatchNorm with momentum=None averages by num_batches_tracked (an integer buffer, read as a
    Python float by torch's module): captured with a tensor factor (capture.cumulative_bn), its
    train-mode forward is generated and verifies only when every call starts from the reference's
    counter as well as its statistics; three calls of the emitted module move the output, the
    statistics and the counter as eager's do."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "fuzz", "bn_momentum_none.py")
    problem = load_problem(path)
    result = optimize_problem(problem, tmp_path, Options(budget_trials=2, device="cpu", log=lambda s: None))
    train = result["modes"]["train"]
    assert train["capture"] == "ok" and train["verify"]["passed"], train["verify"]
    assert result["modes"]["eval"]["verify"]["passed"]
    mod = import_model_new(tmp_path / "model_new.py")
    new, ref = mod.ModelNew().train(), problem.make_model().train()
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for seed in range(3):
            x = problem.make_inputs(seed)
            torch.testing.assert_close(new(*x), ref(*x))
    for (name, a), b in zip(new.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert not mod._KW_WARNED  # the generated forward ran every call


def test_a_model_built_with_a_frozen_norm_answers_for_its_own_flags_only(tmp_path):
    """depthwise_separable3d builds its BatchNorm in eval mode inside a training model: the
    generated forward answers for those flags (and for all-eval, which captures the same graph);
    after .train() the BatchNorm normalises by batch statistics, and the original forward runs."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "sweep", "depthwise_separable3d.py")
    problem = load_problem(path)
    result = optimize_problem(problem, tmp_path, Options(budget_trials=2, device="cpu", log=lambda s: None))
    assert result["modes"].keys() == {"any"} and result["mode_modules"] == ["bn"]
    mod = import_model_new(tmp_path / "model_new.py")
    ref = problem.make_model()
    new = mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(2)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same(lambda: ref(*x), lambda: new(*x))  # as built: the generated forward
        assert _kw_warnings(caught) == []
        ref.train(), new.train()
        _same(lambda: ref(*x), lambda: new(*x))  # all training: batch statistics, the original forward
        assert any("(no generated forward for it)" in w for w in _kw_warnings(caught))


def test_the_report_says_how_each_mode_is_answered(emitted):
    from kernelwright.emit.report import render_report

    _, result, _, _ = emitted
    text = render_report(result)
    assert "mode-dependent submodules: (the model), bn, drop" in text
    assert "- train mode: its generated forward, verification PASS" in text
    assert "- eval mode: its generated forward, verification PASS" in text


# --- outputs in dicts, lists and tuples -----------------------------------------------------------

def test_a_dict_list_and_none_output_is_rebuilt_around_the_generated_tensors(tmp_path):
    problem = load_problem(os.path.join(FIX, "structured_output.py"))
    result = optimize_problem(problem, tmp_path, Options(budget_trials=2, device="cpu", log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    text = (tmp_path / "model_new.py").read_text()
    assert "return {'logits': out[0], 'aux': (None, [out[1], out[2]])}" in text
    mod = import_model_new(tmp_path / "model_new.py")
    ref = problem.make_model()
    new = mod.ModelNew()
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(3)[0]
    for training in (True, False):
        new.train(training), ref.train(training)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error")  # (a fallback to the original forward warns)
            got = new(x)
            want = ref(x)
        assert list(got) == ["logits", "aux"] and got["aux"][0] is None and type(got["aux"][1]) is list
        torch.testing.assert_close(got, want)


class _Reordered(nn.Module):
    """structured_output.py's model written again, returning the right tensors in the wrong
    structure: a tuple where the model returns a dict."""

    def __init__(self, model):
        super().__init__()
        self.m = copy.deepcopy(model)

    def forward(self, x):
        m = self.m
        f = torch.relu(m.bn(m.conv(x)))
        pooled = f.mean((2, 3))
        return (m.cls(pooled),), (None, [torch.sigmoid(m.box(pooled)), f])


def test_verification_fails_a_candidate_returning_another_structure():
    problem = load_problem(os.path.join(FIX, "structured_output.py"))
    res = verify(problem, _Reordered, get_policy("fp32"), "cpu", n_sets=2)
    assert not res.passed and res.failed_check == "outputs"
    assert "returned ((T,), (None, [T, T])), the model returns {'logits': T, 'aux': (None, [T, T])}" in res.reason


class _Hidden(nn.Module):
    """Reads its mode where no search for the name `training` finds it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if getattr(self, "train" + "ing") else y


def test_a_forward_for_both_modes_is_verified_in_both(tmp_path):
    """No submodule is found to depend on the mode, so one forward ("any", captured in training
    mode) would serve both; verified in eval mode too, it fails there, and the original forward
    is kept, saying why."""
    from kernelwright.problem import from_module

    problem = from_module(_Hidden().train(), [torch.randn(4, 8)], "hidden")
    result = optimize_problem(problem, tmp_path, Options(budget_trials=1, device="cpu", log=lambda s: None))
    assert result["mode"] == "any"
    failed = result["verify_fallback"]
    assert not failed["passed"] and failed["reason"].startswith("in eval mode too: "), failed
    assert "original forward kept" in (tmp_path / "model_new.py").read_text()


class _DtypeByMode(nn.Module):
    """Under bf16 autocast its training result is float32 (a layer norm), its eval result bf16 (a Linear)."""

    def __init__(self):
        super().__init__()
        self.fc, self.ln = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(torch.relu(x)) if self.training else self.fc(torch.relu(x))


def test_each_modes_forward_returns_eagers_dtype_in_that_mode(tmp_path):
    """Eager's output dtypes under the bf16 policy's autocast are read in each mode: the eval forward
    returns bf16 as eager's eval call does, the training forward float32."""
    from kernelwright.problem import from_module

    model = _DtypeByMode().train()
    problem = from_module(model, [torch.randn(4, 8)], "dtype_by_mode")
    result = optimize_problem(problem, tmp_path, Options(budget_trials=1, device="cpu", precision="bf16",
                                                         log=lambda s: None))
    assert set(result["modes"]) == {"train", "eval"}
    mod = import_model_new(tmp_path / "model_new.py")
    fast = mod.attach(copy.deepcopy(model))
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert fast.train()(x).dtype == torch.float32
        assert fast.eval()(x).dtype == torch.bfloat16


def test_a_failure_inside_tuning_keeps_the_original_forward_and_says_why(tmp_path, monkeypatch):
    """An exception out of the search (a fault of kernelwright's) is no traceback out of optimize:
    that mode runs the original forward, and the reason is one line in result.json."""
    import kernelwright.pipeline as pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("view size is not compatible\nwith input tensor's size and stride")

    monkeypatch.setattr(pipeline, "tune_plan", broken)
    problem = load_problem(os.path.join(FIX, "conv_bn_dropout.py"))
    result = optimize_problem(problem, tmp_path, Options(budget_trials=1, device="cpu", mode="eval",
                                                         log=lambda s: None))
    assert result["capture"] == "tuning failed: RuntimeError: view size is not compatible"
    assert result["verify"]["passed"]  # (the original forward, verified as the module that ships)
    assert "_kw_forward" not in (tmp_path / "model_new.py").read_text()
