"""The runtime every emitted module imports (emit/runtime.py, shipped as kernels/_runtime.py): the
call guard and its warn-once fallback to the original forward, the parameter guard, the dispatch
by training mode, the bf16 policy of the fallback, compute + commit forwards, attach() for live
modules; the folder an emitted module is (its runtime copied once, loaded afresh per import,
--single-file); and the size of what users keep."""
import copy
import os
import pickle
import warnings

import pytest
import torch
import torch.nn as nn

from kernelwright.emit import runtime as rt
from kernelwright.emit.module import import_model_new, render_model_new, single_file, write_module
from kernelwright.problem import from_module, load_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, scale=1.0, **extra):
        return self.drop(self.fc(x)) * scale + extra.get("bias", 0.0)


def _tensors(module):
    return (module.fc.weight, module.fc.bias)


def _guard(policy="fp32", modes=("train", "eval")):
    """A Specialised over Net for float32 [2, 4] inputs, with a generated forward for each of
    `modes` (Net.drop's flag: True in train mode) that records its calls; (guard, calls)."""
    calls = []

    def generated(tag):
        def forward(module, x):
            calls.append(tag)
            return torch.full((2, 3), 7.0)
        return forward

    forwards = [rt.Forward(mode, [(mode == "train",)], _tensors, (torch.float32,) * 2, generated(mode))
                for mode in modes]
    guard = rt.Specialised(Net.forward, policy, "cpu", [(torch.Size((2, 4)), (4, 1), torch.float32)], ("drop",),
                           forwards)
    return guard, calls


def _net(guard):
    class New(Net):
        _kw_cuda_graphs = False
        forward = guard.forward

    torch.manual_seed(0)
    return New()


def _warnings(caught):
    return [str(w.message) for w in caught if "kernelwright" in str(w.message)]


def test_a_specialised_call_runs_the_generated_forward_of_the_modules_mode():
    guard, calls = _guard()
    net, x = _net(guard), torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert net(x).eq(7).all() and calls == ["train"]
        net.eval()
        assert net(x).eq(7).all() and calls == ["train", "eval"]
    assert _warnings(caught) == [] and guard.warned == set()


@pytest.mark.parametrize("call,why", [
    (lambda net, x: net(x, scale=2.0), "2 positional arguments (specialised for 1)"),
    (lambda net, x: net(x, 2.0), "2 positional arguments (specialised for 1)"),
    (lambda net, x: net(x, bias=2.0), "keyword arguments bias"),
    (lambda net, x: net.double()(x.double()), "argument 0 is torch.float64 (2, 4)"),
    (lambda net, x: net(x[:1]), "argument 0 is torch.float32 (1, 4)"),
    (lambda net, x: net(x.t().contiguous().t()), "strides (1, 2)"),
])
def test_other_calls_run_the_original_forward_warning_once_per_reason(call, why):
    guard, calls = _guard()
    net, x = _net(guard).eval(), torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, again = call(net, x), call(net, x)
    torch.testing.assert_close(again, first)
    assert not first.eq(7).all()  # the original forward's result, not the generated one's
    assert calls == []
    messages = _warnings(caught)
    assert len(messages) == 1 and why in messages[0] and "running the original forward" in messages[0]
    assert caught[0].filename == __file__  # the warning names the caller's line
    assert len(guard.warned) == 1


def test_arguments_given_by_keyword_are_bound_to_their_positions():
    """`net(x=x)` is the specialised call `net(x)`: the forward's signature binds the keyword."""
    guard, calls = _guard()
    net, x = _net(guard), torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert net(x=x).eq(7).all() and calls == ["train"]
    assert _warnings(caught) == []


def test_gradients_autocast_parameters_and_modes_without_a_forward_take_the_original():
    guard, calls = _guard()
    net, x = _net(guard).eval(), torch.randn(2, 4)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert net(x.clone().requires_grad_()).requires_grad  # an input needs gradients
        assert net(x).requires_grad  # the parameters need gradients
        with torch.no_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert net(x).dtype == torch.bfloat16  # the caller's autocast, honoured
            net.double()
            with pytest.raises(RuntimeError):
                net(x)  # float32 input, float64 parameters: the original forward's own error
    assert calls == []
    assert sorted(guard.warned) == ["gradients (an input requires grad)", "gradients (parameters require grad)",
                                    "parameters of another dtype", "the caller's autocast"]
    only_train, calls = _guard(modes=("train",))
    net = _net(only_train).eval()
    with torch.no_grad(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        net(x)
    assert calls == [] and only_train.warned == {"the module in eval mode (False,) (no generated forward for it)"}


def test_parameters_needing_gradients_fall_back_only_when_gradients_are_on():
    tensors = (torch.zeros(2, requires_grad=True),)
    assert rt.Specialised.params_mismatch(tensors, (torch.float32,)) == "gradients (parameters require grad)"
    with torch.no_grad():
        assert rt.Specialised.params_mismatch(tensors, (torch.float32,)) is None
        assert rt.Specialised.params_mismatch(tensors, (torch.float64,)) == "parameters of another dtype"


def test_the_original_forward_keeps_the_bf16_policy_unless_the_caller_chose_an_autocast():
    guard, _ = _guard("bf16")
    net, x = _net(guard), torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert net(x, scale=1.0).dtype == torch.bfloat16  # the policy's autocast
        fp32, _ = _guard("fp32")
        assert _net(fp32)(x, scale=1.0).dtype == torch.float32


def test_a_forward_given_as_compute_and_commit_updates_its_buffers_once_per_call():
    m = nn.Module()
    m.register_buffer("count", torch.zeros(()))
    m.lin = nn.Linear(2, 2)

    def compute(module, x):
        return x * 2, (module.count + 1,)

    def commit(module, new):
        module.count.copy_(new)

    guard = rt.Specialised(None, "fp32", "cpu", [(torch.Size((2,)), (1,), torch.float32)], (),
                           [rt.Forward("any", [()], lambda mod: (mod.count,), (torch.float32,), compute=compute,
                                       commit=commit)])
    guard.attach(m)
    with torch.no_grad():
        for n in (1, 2, 3):
            assert m(torch.ones(2)).tolist() == [2.0, 2.0] and float(m.count) == n


def test_attach_pickles_without_the_forward_and_copies_with_it():
    guard, calls = _guard()
    net = guard.attach(Net().eval())
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert net(x).eq(7).all() and calls == ["eval"]
        back = pickle.loads(pickle.dumps(net))
        assert "forward" not in back.__dict__ and not back(x).eq(7).all()  # its own class's forward
        twin = copy.deepcopy(net)
        assert twin(x).eq(7).all() and calls == ["eval", "eval"] and twin.fc.weight is not net.fc.weight


def test_the_replay_is_loaded_from_kernelwright_when_the_module_does_not_ship_it():
    guard, calls = _guard()
    net = _net(guard).eval()
    net._kw_cuda_graphs = True
    with torch.no_grad():
        assert net(torch.randn(2, 4)).eq(7).all() and calls == ["eval"]  # CPU inputs: not captured
    from kernelwright.emit import graphs

    assert guard.graphs is graphs and guard.graphs_of(net) == {}


def test_constants_are_made_once_per_device():
    a = rt.constant("c_test_once", [1.0, 2.0], torch.float32, torch.device("cpu"))
    assert rt.constant("c_test_once", [1.0, 2.0], torch.float32, torch.device("cpu")) is a


# --- the emitted folder ------------------------------------------------------------------------

def _emitted(tmp_path, name="level2/gemm_gelu_scale.py"):
    from kernelwright.capture import capture
    from kernelwright.emit.module import ModeForward
    from kernelwright.plan import plan_graph

    problem = load_problem(os.path.join(ROOT, "problems", name), small=True)
    plan = plan_graph(capture(problem))
    text = render_model_new(problem, [ModeForward("any", plan)], "fp32", None, device_type="cpu")
    return problem, write_module(tmp_path / "out", text, {})


def test_the_runtime_ships_once_and_each_import_gets_its_own(tmp_path):
    problem, path = _emitted(tmp_path)
    shipped = sorted(p.name for p in (path.parent / "kernels").glob("*.py"))
    assert shipped == ["_runtime.py"]  # no kernel, no replay: the guard's runtime only
    assert (path.parent / "kernels" / "_runtime.py").read_text() == open(rt.__file__).read()
    a, b = import_model_new(path), import_model_new(path)
    assert a._rt is not b._rt and a._KW_WARNED is not b._KW_WARNED
    new = a.ModelNew(*problem.get_init_inputs())
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        new(*problem.make_inputs(1))  # gradients on: the original forward
    assert a._KW_WARNED and not b._KW_WARNED


def test_a_single_file_module_carries_its_folder(tmp_path):
    problem, path = _emitted(tmp_path)
    single_file(path.parent)
    assert not (path.parent / "kernels").exists()
    text = path.read_text()
    ns = {"__name__": "harness"}  # as a harness that execs the text, without a path
    exec(compile(text, "<model_new>", "exec"), ns)
    ref = problem.make_model()
    new = ns["ModelNew"](*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(2)
    with torch.no_grad():
        torch.testing.assert_close(new(*x), ref(*x))
    assert ns["_KW_WARNED"] == set()


def test_from_a_live_module_attach_is_emitted(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    text = render_model_new(from_module(model, [torch.randn(2, 4)]), [], "fp32", None)
    assert "def attach(model):" in text and "class ModelNew" not in text


# --- what users keep ---------------------------------------------------------------------------

@pytest.mark.interpreter
def test_a_one_group_problem_is_a_short_module_and_its_kernel_holds_no_unused_helper(tmp_path):
    from kernelwright.pipeline import Options, optimize_problem

    out = tmp_path / "out"
    problem = load_problem(os.path.join(ROOT, "problems", "level2", "gemm_group_norm_swish.py"), small=True)
    result = optimize_problem(problem, out, Options(device="cpu", budget_trials=1, small=True,
                                                    db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"] and [g["strategy"] for g in result["groups"]].count("triton") == 1
    text = (out / "model_new.py").read_text()
    assert len(text.splitlines()) <= 100
    assert text.count("class Model(") == 1 and text.count("def get_inputs(") == 1  # the problem, once
    kernels = [p for p in (out / "kernels").glob("*.py") if not p.name.startswith("_")]
    assert len(kernels) == 1
    source = kernels[0].read_text()
    assert len(source.splitlines()) <= 80 and "def _launch(" not in source
    assert _unused_helpers(source) == set()
    assert _unused_helpers(source + "\n\n@triton.jit\ndef kw_tanh(x):\n    return x\n") == {"kw_tanh"}


def _unused_helpers(source):
    """The shared helpers (codegen/helpers.py) `source` imports or defines that nothing else in it uses."""
    import ast

    from kernelwright.codegen.helpers import HOST, device_library, names_used

    library = {b.name for b in device_library()}
    lines = source.splitlines(keepends=True)
    own = {}  # helper -> the lines that import or define it
    for node in ast.parse(source).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "".join(lines[first - 1:node.end_lineno])
        if isinstance(node, ast.Try):
            own.update({a.name: text for a in node.body[0].names if a.name in HOST})
        elif isinstance(node, ast.FunctionDef) and node.name in library:
            own[node.name] = text
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in library:
            own[node.targets[0].id] = text
    return {name for name, text in own.items() if name not in names_used(source.replace(text, ""))}


def test_on_the_gpu_the_forward_runs_on_its_inputs_device(monkeypatch):
    """Generated kernels launch on the current device: a call whose inputs sit on another GPU runs
    under that device; parameters on another GPU than the inputs take the original forward. (No
    GPU here: a tensor holding k stands for one on GPU k, and the device switch is recorded.)"""
    switched, seen = [], []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            switched.append(self.index)

        def __exit__(self, *exc):
            switched.append("back")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: int(t.item()))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    on = torch.tensor
    run = rt._on_the_inputs_device(lambda module, args, state: seen.append(int(args[0])) or "out",
                                   lambda module: (on(module),))
    assert run(1, (on(1),)) == "out" and switched == [1, "back"] and seen == [1]
    assert run(0, (on(0),)) == "out" and switched == [1, "back"] and seen == [1, 0]  # the current device
    fell = run(0, (on(1),))
    assert isinstance(fell, rt.Fallback) and fell.why == "parameters on another device than the inputs"
