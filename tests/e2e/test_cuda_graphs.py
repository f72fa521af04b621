"""The emitted forward replayed as CUDA graphs (emit/graphs.py `graphed`, shipped as
kernels/_graphs.py) and optimize's choice between it and the plain forward (measure.final.pick_forward).

CPU tests check the rendering, the plain path a graphs-on module takes off the GPU, the replay's
bookkeeping with torch.cuda's graph API emulated, and the choice; the GPU tests check the replay
itself: same results as the plain forward over new inputs, outputs
that the next call does not overwrite, running statistics updated once per call, a recapture after
a weight changes in place, and a forward that cannot be captured running as it is. Run the GPU
tests alone, without TRITON_INTERPRET (the kernels must be compiled for the GPU):
`python -m pytest tests/e2e/test_cuda_graphs.py`.
"""
import copy
import ctypes
import os
import pickle
import weakref

import pytest
import torch

from kernelwright.capture import capture
from kernelwright.emit import graphs as kwgraphs
from kernelwright.emit.module import import_model_new, ModeForward, render_model_new, write_module
from kernelwright.measure.final import GRAPHS, PLAIN, pick_forward, replay_paths
from kernelwright.pipeline import Options
from kernelwright.search.plan_search import tune_plan
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem

from fake_graphs import FakeGraphs  # tests/fake_graphs.py (tests/ is on the path through conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
gpu = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                         reason="needs a CUDA GPU (and compiled Triton kernels, not the interpreter)")


def _emit(fake_clock, tmp_path, name, device, cuda_graphs=True, precision="fp32"):
    """The problem's model_new.py with every generated kernel chosen (a fake clock makes them
    faster than the library), imported; returns (problem, module, plan)."""
    fake_clock(5.0, 1.0, device=device)
    problem = load_problem(os.path.join(ROOT, "problems", name), small=True)
    plan = plan_graph(rewrite(capture(problem), precision)[0])
    opts = Options(device=str(device), budget_trials=2, db_path=str(tmp_path / "db.jsonl"), log=lambda s: None)
    summary, kernels, sources, support = tune_plan(problem, plan, get_policy(precision), torch.device(device), True,
                                                      tmp_path / ".build", opts, {"groups": []})
    text = render_model_new(problem, [ModeForward("any", plan, kernels, sources, summary, support)], precision, None, cuda_graphs=cuda_graphs)
    return problem, import_model_new(write_module(tmp_path / "out", text, sources, support)), plan


def _pair(problem, mod, device):
    """(plain, graphed) ModelNew instances with the same weights and buffers."""
    ref = problem.make_model(device)
    out = []
    for graphs in (False, True):
        with torch.device(device):
            m = mod.ModelNew(*problem.get_init_inputs())
        m.load_state_dict(ref.state_dict())
        m = m.to(device).train(ref.training)
        m._kw_cuda_graphs = graphs
        out.append(m)
    return out


# --- CPU ---------------------------------------------------------------------------------------

@pytest.mark.interpreter
def test_rendering_names_every_parameter_and_buffer_and_the_switch(fake_clock, tmp_path):
    problem, mod, plan = _emit(fake_clock, tmp_path, "level2/conv2d_batch_norm_train_relu.py", "cpu")
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert "_kw_cuda_graphs = True" in text and 'graphs=_kw_import("_graphs")' in text
    assert (tmp_path / "out" / "kernels" / "_graphs.py").read_text() == open(kwgraphs.__file__).read()
    tensors = text.split("def _kw_tensors", 1)[1].split("\ndef ", 1)[0]
    model = problem.make_model()
    for fqn, _ in [*model.named_parameters(), *model.named_buffers()]:
        assert f"self.{fqn}" in tensors, fqn  # running stats and num_batches_tracked included
    new = mod.ModelNew(*problem.get_init_inputs())
    assert [id(t) for t in mod._kw_tensors(new)] == [id(t) for t in [*new.parameters(), *new.buffers()]]
    plain = render_model_new(problem, [ModeForward("any", plan, {}, {}, [])], "fp32", None)
    assert "_kw_cuda_graphs = False" in plain and '_kw_import("_graphs")' not in plain
    # the running statistics' updates are kept out of the captured part and committed after a replay
    flat = " ".join(text.split())
    assert '_rt.Forward("any", [()], _kw_tensors, ' in flat and "compute=_kw_compute_any, commit=_kw_commit_any)" in flat
    compute = text.split("def _kw_compute_any", 1)[1].split("def _kw_commit_any", 1)[0]
    commit = text.split("def _kw_commit_any", 1)[1].split("\n\n", 1)[0]
    assert "running_mean" in compute and "copy_(" not in compute and "_foreach_" not in compute
    assert "_foreach_add_([b_bn_num_batches_tracked], 1)" in commit and "b_bn_running_mean" in commit
    gemm = load_problem(os.path.join(ROOT, "problems", "level2", "gemm_gelu_scale.py"), small=True)
    gemm_text = render_model_new(gemm, [ModeForward("any", plan_graph(rewrite(capture(gemm), "fp32")[0]), {}, {}, [])], "fp32", None, cuda_graphs=True)
    assert '_rt.Forward("any", [()], _kw_tensors, (torch.float32,) * 2, _kw_forward_any)' in " ".join(gemm_text.split())
    assert "def _kw_commit_any" not in gemm_text


@pytest.mark.interpreter
def test_off_the_gpu_a_graphs_on_module_runs_its_forward_as_it_is(fake_clock, tmp_path):
    problem, mod, _ = _emit(fake_clock, tmp_path, "level2/conv2d_batch_norm_train_relu.py", "cpu")
    plain, graphed = _pair(problem, mod, "cpu")
    for seed in (1, 2):
        x = problem.make_inputs(seed)
        with torch.no_grad():
            torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)
    assert not mod._kw_graphs_of(graphed)  # CPU inputs: nothing captured, nothing kept
    assert not kwgraphs.capturable([torch.zeros(3)]) and not kwgraphs.capturable([1.0])
    assert kwgraphs.signature([torch.zeros(3), object()]) is None  # not a key


@pytest.mark.interpreter
def test_a_capture_is_keyed_by_the_switches_that_choose_library_kernels():
    mod = kwgraphs
    base = mod.switches()
    with torch.inference_mode():
        assert mod.switches() != base
    if torch.cuda.is_available():  # (autocast on "cuda" is switched off without a GPU)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert mod.switches() != base
    for flag, value in ((torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"),
                        (torch.backends.cudnn, "deterministic"),
                        (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction")):
        was = getattr(flag, value)
        try:
            setattr(flag, value, not was)
            assert mod.switches() != base, value
        finally:
            setattr(flag, value, was)
    assert mod.switches() == base


def _t(ms):
    return {"median_ms": ms, "mean_ms": ms, "runs": 10}


def test_pick_forward_takes_the_replay_only_when_clearly_faster():
    timing = {"kernelwright": _t(1.0), GRAPHS: _t(0.5), "eager": _t(2.0),
              "kernels_per_call": {"kernelwright": ["plain's"], GRAPHS: ["replay's"]}, "syncs": {"kernelwright": "x:1"}}
    assert pick_forward(timing) is True
    assert timing["kernelwright"]["median_ms"] == 0.5 and timing[PLAIN]["median_ms"] == 1.0 and timing["cuda_graphs"]
    # the per-implementation tables name the plain forward as the timing table does
    assert timing["kernels_per_call"] == {PLAIN: ["plain's"], GRAPHS: ["replay's"]} and timing["syncs"] == {PLAIN: "x:1"}
    tie = {"kernelwright": _t(1.0), GRAPHS: _t(0.99)}
    assert pick_forward(tie) is False
    assert tie["kernelwright"]["median_ms"] == 1.0 and tie["cuda_graphs"] is False
    alone = {"kernelwright": _t(1.0)}
    assert pick_forward(alone) is False and alone == {"kernelwright": _t(1.0)}


def _issued(ms, issue_ms):
    return {**_t(ms), "issue_ms": issue_ms}


def test_pick_forward_takes_a_tied_replay_when_the_plain_forward_is_near_host_bound():
    """bf16 resnet_basic_block as measured (docs/benchmarks.md, "Design choices"): plain 0.375 ms with 0.324 ms of host issue, the replay
    0.369 ms with 0.054 -- a tie on that host, but the plain forward's time follows the host's."""
    near = {"kernelwright": _issued(0.375, 0.324), GRAPHS: _issued(0.369, 0.054)}
    assert pick_forward(near) is True and near["cuda_graphs_why"] == "host-bound"
    # with host headroom (conv2d_batch_norm_train_relu, the same run) the tie keeps the plain one
    roomy = {"kernelwright": _issued(0.893, 0.271), GRAPHS: _issued(0.889, 0.064)}
    assert pick_forward(roomy) is False and roomy["cuda_graphs_why"] == "not faster"
    slower = {"kernelwright": _issued(0.375, 0.324), GRAPHS: _issued(0.380, 0.054)}
    assert pick_forward(slower) is False  # never a slower replay
    unknown = {"kernelwright": _t(0.375), GRAPHS: _t(0.369)}
    assert pick_forward(unknown) is False  # no issue times: only "clearly faster" counts
    from kernelwright.emit.report import render_report

    text = render_report({"problem": "p", "precision": "bf16", "device": "cuda", "capture": "ok", "groups": [],
                          "timing": near})
    assert "ModelNew replays its forward as CUDA graphs (kernelwright:graphs was not slower" in text
    assert "0.324 ms a call, is 86% of its time" in text


def test_report_says_which_forward_ships_and_how_the_replay_ran():
    from kernelwright.emit.report import render_report

    timing = {"kernelwright": _t(1.0), GRAPHS: _t(0.5), "eager": _t(2.0),
              "replay_paths": [{"captured": True, "copies_in": False, "copies_out": True}]}
    pick_forward(timing)
    text = render_report({"problem": "p", "precision": "bf16", "device": "cuda", "capture": "ok", "groups": [],
                          "timing": timing})
    assert "| kernelwright:plain | 1.000 |" in text and "| kernelwright:graphs | 0.500 |" in text
    assert "ModelNew replays its forward as CUDA graphs" in text
    assert "- timed replay: inputs read in place, outputs copied out" in text


@pytest.mark.interpreter
def test_replay_bookkeeping_on_the_cpu(monkeypatch):
    """graphed's decisions, with the graph API emulated: no copies while the caller passes the
    same memory and drops its results; buffers of ours once it passes other tensors; copies out
    once it keeps a result; a new capture when a weight changes in place; exactly one run of the
    forward per call."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    w, calls, holder = torch.tensor([2.0, 3.0]), [], torch.nn.Module()
    fwd, state = fake.forward(w, calls), lambda: mod.stamp(w)
    x = torch.tensor([1.0, 1.0])

    made = []

    def call(*args):
        made.append(1)
        return mod.graphed(holder, "t", fwd, args, state)

    assert call(x).tolist() == [3.0, 4.0] and fake.captures == 1 and fake.replays == 0
    entry = next(iter(mod.graphs_of(holder).values()))
    assert entry.inputs is None and entry.lend[0] is not None  # reads x where it is, lends its output
    assert replay_paths(mod.graphs_of(holder)) == [{"captured": True, "copies_in": False, "copies_out": False}]
    ptr = call(x).data_ptr()
    x.mul_(2)  # in place, same memory: the replay reads it there
    y = call(x)
    assert y.tolist() == [5.0, 7.0] and y.data_ptr() == ptr and fake.replays == 2 and fake.captures == 1
    kept = call(x)  # y is still held: this call must not overwrite it
    assert kept.tolist() == [5.0, 7.0] and y.tolist() == [5.0, 7.0] and fake.captures == 2
    entry = next(iter(mod.graphs_of(holder).values()))
    assert entry.lend == [None] and entry.inputs is None
    assert replay_paths(mod.graphs_of(holder)) == [{"captured": True, "copies_in": False, "copies_out": True}]
    again = call(x)
    assert again.data_ptr() not in (kept.data_ptr(), entry.outputs[0].data_ptr())  # a copy
    z = torch.tensor([1.0, 2.0])  # other memory: captured again, reading it where it is
    assert call(z).tolist() == [3.0, 7.0] and fake.captures == 3
    assert next(iter(mod.graphs_of(holder).values())).inputs is None
    assert call(torch.tensor([0.0, 1.0])).tolist() == [1.0, 4.0] and fake.captures == 4  # moved twice: ours
    assert next(iter(mod.graphs_of(holder).values())).inputs is not None
    assert replay_paths(mod.graphs_of(holder)) == [{"captured": True, "copies_in": True, "copies_out": True}]
    assert call(torch.tensor([2.0, 2.0])).tolist() == [5.0, 7.0] and fake.captures == 4
    w.mul_(-1)  # a weight changed in place: its version moved
    assert call(z).tolist() == [-1.0, -5.0] and fake.captures == 5
    assert call(z).tolist() == [-1.0, -5.0] and fake.captures == 5
    # each call ran the forward or replayed it, once; each capture traced it once more (no kernels)
    assert fake.replays == 5 and len(calls) == len(made) - fake.replays + fake.captures
    # the captures live outside the module: it still pickles and copies, and a copy starts afresh
    pickle.dumps(holder)
    assert mod.graphs_of(copy.deepcopy(holder)) == {} and mod.graphs_of(holder)

    def waits(x):  # a forward that cannot be captured
        if fake.open is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        return x + 1
    other = torch.nn.Module()
    for _ in range(3):
        assert mod.graphed(other, "t", waits, (x,), state).tolist() == [3.0, 3.0]
        assert fake.stream == "caller's"  # the failed capture did not leave its stream current
    assert next(iter(mod.graphs_of(other).values())).graph is None
    assert replay_paths(mod.graphs_of(other)) == [{"captured": False, "copies_in": False, "copies_out": False}]


@pytest.mark.interpreter
def test_inputs_are_copied_in_and_outputs_copied_out_one_by_one(monkeypatch):
    """A training graph's replay: a saved tensor at a stable address is read in place while the
    gradient beside it moves (only that one copied in, with its own strides), an output the caller
    keeps is copied out while the others stay lent, and an output that is a view of an input read
    in place is returned as that view, never copied."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    calls, holder = [], torch.nn.Module()

    def forward(saved, grad):  # -> (saved * grad, saved + grad, saved's first row): two new tensors, a view
        calls.append(1)
        prod, total = torch.empty_like(saved), torch.empty_like(saved)

        def work():
            torch.mul(saved, grad, out=prod)
            torch.add(saved, grad, out=total)
        fake.open.work.append(work) if fake.open is not None else work()
        return prod, total, saved[0]

    saved = torch.arange(6.0).reshape(2, 3)
    grad = lambda v: torch.full((2, 6), v)[:, ::2]  # noqa: E731 - a view with gaps (strides (6, 2))
    call = lambda v: mod.graphed(holder, "t", forward, (saved, grad(v)), lambda: ())  # noqa: E731
    entry = lambda: next(iter(mod.graphs_of(holder).values()))  # noqa: E731
    call(1.0)
    assert fake.captures == 1 and entry().alias == [False, False, True] and None not in entry().lend[:2]
    call(2.0)  # the gradient elsewhere: captured again where it is now
    assert fake.captures == 2 and entry().inputs is None
    call(2.5)  # elsewhere again, the saved tensor where it was: only the gradient copied in from now on
    e = entry()
    assert fake.captures == 3 and e.inputs[0] is None and e.inputs[1].stride() == (6, 2)
    assert e.ptrs[0] == saved.data_ptr() and e.ptrs[1] is None
    prod, total, row = call(3.0)  # replayed: the graph's own tensors, the input's view
    assert fake.replays == 1 and prod.tolist() == [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]
    assert prod.data_ptr() == e.outputs[0].data_ptr() and total.data_ptr() == e.outputs[1].data_ptr()
    assert row.data_ptr() == saved.data_ptr() and row.tolist() == [0.0, 1.0, 2.0]
    kept = total
    del prod, total, row
    call(4.0)  # `kept` would be overwritten: the forward runs, captured again, that output copied from now on
    assert fake.captures == 4 and kept.tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    e = entry()
    assert e.lend[0] is not None and e.lend[1] is None and e.alias == [False, False, True] and e.inputs[0] is None
    assert replay_paths(mod.graphs_of(holder)) == [{"captured": True, "copies_in": True, "copies_out": True}]
    prod, kept2, row = call(5.0)
    assert fake.replays == 2 and prod.data_ptr() == e.outputs[0].data_ptr()  # still lent
    assert kept2.data_ptr() != e.outputs[1].data_ptr() and kept2.stride() == (3, 1)
    del prod, row
    assert call(6.0)[1].tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]] and fake.replays == 3 and fake.captures == 4
    assert kept2.tolist() == [[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]] and kept.tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    assert len(calls) == 4 + fake.captures  # four calls ran the forward, each capture traced it; no replay did

    # an expanded input (elements sharing memory) is read in place; once it moves, no buffer of
    # ours can hold it: the forward runs as it is from then on
    call = lambda g: mod.graphed(holder, "t", forward, (saved, g), lambda: ())  # noqa: E731
    assert call(torch.ones(3).expand(2, 3))[0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert call(torch.full((3,), 2.0).expand(2, 3))[0].tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert fake.captures == 6  # first where it was, then where it is now
    assert call(torch.full((3,), 2.5).expand(2, 3))[0].tolist() == [[0.0, 2.5, 5.0], [7.5, 10.0, 12.5]]
    assert list(mod.graphs_of(holder).values())[-1].graph is None and fake.captures == 6
    assert call(torch.full((3,), 3.0).expand(2, 3))[1].tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]


@pytest.mark.interpreter
def test_outputs_that_are_views_of_the_graphs_own_tensors_are_lent(monkeypatch):
    """Views of a tensor the graph computes (q, k, v split from one projection; a weight
    gradient as a permute of a permute) are lent like any output while the caller lets them go:
    their bases are the graph's, held by the capture alone. A view of a weight is not lent (its
    storage is the module's), and once the caller keeps one view, it and the views sharing its
    storage are copied out from then on."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    w, holder = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.nn.Module()

    def forward(x):  # -> (three column pairs of 2 * x, (x + 1) permuted twice, a view of w)
        wide, plus = torch.empty(2, 6), torch.empty(2, 2)
        at = (wide.data_ptr(), plus.data_ptr())  # (a graph holds addresses, not tensors)

        def work():
            for ptr, value in zip(at, ((x.repeat(1, 3) * 2).contiguous(), x + 1)):
                ctypes.memmove(ptr, value.data_ptr(), value.numel() * value.element_size())
        fake.open.work.append(work) if fake.open is not None else work()
        q, k, v = wide.split(2, dim=1)
        return q, k, v, plus.t().t(), w.t()

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    call = lambda: mod.graphed(holder, "t", forward, (x,), lambda: mod.stamp(w), lambda: [w])  # noqa: E731
    call()
    e = next(iter(mod.graphs_of(holder).values()))
    assert [c is not None for c in e.lend] == [True, True, True, True, False] and e.alias == [False] * 5
    x.mul_(2)  # (in place: read there)
    q, k, v, p, wt = call()
    assert fake.replays == 1 and fake.captures == 1
    assert q.tolist() == [[4.0, 8.0], [12.0, 16.0]] and v.tolist() == q.tolist() and p.tolist() == [[3.0, 5.0], [7.0, 9.0]]
    assert q.data_ptr() == e.outputs[0].data_ptr() and p.data_ptr() == e.outputs[3].data_ptr()  # lent: no copies
    assert wt.data_ptr() != w.data_ptr() and wt.tolist() == [[1.0, 3.0], [2.0, 4.0]]  # a copy of the weight's view
    del q, v, p, wt
    kept = k
    call()  # k would be overwritten: run as it is, captured again, q, k, v copied out from then on
    assert fake.captures == 2 and kept.tolist() == [[4.0, 8.0], [12.0, 16.0]]
    e = next(iter(mod.graphs_of(holder).values()))
    assert [c is not None for c in e.lend] == [False, False, False, True, False]
    q, k, v, p, wt = call()
    assert fake.replays == 2 and q.data_ptr() != e.outputs[0].data_ptr() and p.data_ptr() == e.outputs[3].data_ptr()


@pytest.mark.interpreter
def test_a_modules_patience_says_how_often_a_moved_input_is_followed_before_it_is_copied(monkeypatch):
    """With `_kw_patience` (3, 1), an input that moves on every call is captured again where it is
    three times before it is copied in; the other is copied in from its second move."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    holder = torch.nn.Module()
    holder._kw_patience = (3, 1)
    calls = []

    def forward(a, b):
        calls.append(1)
        out = torch.empty_like(a)
        work = lambda: torch.add(a, b, out=out)  # noqa: E731
        fake.open.work.append(work) if fake.open is not None else work()
        return out

    owned = []
    for n in range(6):
        a, b = torch.full((2,), float(n)), torch.full((2,), 10.0 * n)
        assert mod.graphed(holder, "t", forward, (a, b), lambda: ()).tolist() == [11.0 * n] * 2
        e = next(iter(mod.graphs_of(holder).values()))
        owned.append(tuple(x is not None for x in e.inputs) if e.inputs is not None else (False, False))
    assert owned == [(False, False), (False, False), (False, True), (False, True), (True, True), (True, True)]
    assert fake.captures == 5 and fake.replays == 1  # the last call replayed, copying both in


@pytest.mark.interpreter
def test_a_backward_whose_saved_tensor_moves_every_step_settles_into_copies_within_a_few_steps(monkeypatch):
    """The backend's patience for a backward graph (a saved tensor, then the gradient `tangents_1`)
    when the forward runs as captured, so that both inputs are new tensors every step: the saved
    tensor is captured again SAVED_PATIENCE times, then both are copied in and every later step
    replays (each capture costs milliseconds of host time; a copy, microseconds of the GPU's)."""
    from kernelwright import backend as kwb

    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)

    class Backward(torch.nn.Module):
        def forward(self, mul, tangents_1):
            return mul * tangents_1

    gm = torch.fx.symbolic_trace(Backward())
    holder = torch.nn.Module()
    holder._kw_patience = kwb.replay_patience(gm, set())
    assert holder._kw_patience == (kwb.SAVED_PATIENCE, 1)

    def forward(a, b):
        out = torch.empty_like(a)
        work = lambda: torch.mul(a, b, out=out)  # noqa: E731
        fake.open.work.append(work) if fake.open is not None else work()
        return out

    steps, kept = 10, []
    for n in range(steps):
        saved, grad = torch.full((2,), float(n)), torch.full((2,), 2.0)
        kept.append((saved, grad))  # (alive, so that every step's tensors are new memory)
        assert mod.graphed(holder, "t", forward, (saved, grad), lambda: ()).tolist() == [2.0 * n] * 2
    # the first call, then a capture per followed move; from the fifth step on, replays with copies
    assert fake.captures == kwb.SAVED_PATIENCE + 2 <= 4
    assert fake.replays == steps - fake.captures


@pytest.mark.interpreter
def test_a_forward_updating_no_buffer_is_replayed_before_its_state_is_checked(monkeypatch):
    """Given what the graph reads and no buffer update, the replay is issued first and the state
    checked while the GPU runs it: a moved state costs one dropped replay and a run of the forward;
    the capture holds what it reads (a replaced weight lives as long as the capture). Without
    `reads` (a forward that may write buffers itself) nothing is replayed on a moved state."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    box, calls = {"w": torch.tensor([2.0, 3.0])}, []

    def forward(x):  # reads the current weight when it runs (or is captured)
        return fake.forward(box["w"], calls)(x)

    state, reads = (lambda: mod.stamp(box["w"])), (lambda: (box["w"],))
    x, holder = torch.tensor([1.0, 1.0]), torch.nn.Module()
    call = lambda: mod.graphed(holder, "t", forward, (x,), state, reads)  # noqa: E731
    assert call().tolist() == [3.0, 4.0] and (fake.captures, fake.replays) == (1, 0)
    assert call().tolist() == [3.0, 4.0] and (fake.captures, fake.replays) == (1, 1)
    old = weakref.ref(box["w"])
    box["w"] = torch.tensor([-1.0, 1.0])  # replaced: the capture still reads (and holds) the old one
    assert old() is not None
    runs = len(calls)
    assert call().tolist() == [0.0, 2.0]  # the replay (of the old weight) was dropped
    assert (fake.captures, fake.replays) == (2, 2) and len(calls) == runs + 2  # the forward ran, then was captured
    assert old() is None  # the new capture let the old weight go
    assert call().tolist() == [0.0, 2.0] and (fake.captures, fake.replays) == (2, 3)
    box["w"].mul_(2)  # in place: the version moves, the same
    assert call().tolist() == [-1.0, 3.0] and (fake.captures, fake.replays) == (3, 4)

    checked = torch.nn.Module()  # without `reads` (the forward may write buffers): checked first
    check = lambda: mod.graphed(checked, "t", forward, (x,), state)  # noqa: E731
    check(), check()
    assert (fake.captures, fake.replays) == (4, 5)
    box["w"].mul_(-1)
    assert check().tolist() == [3.0, -1.0] and (fake.captures, fake.replays) == (5, 5)  # no replay


@pytest.mark.interpreter
def test_buffer_updates_are_committed_once_per_call_after_the_replay(monkeypatch):
    """A forward split into compute (the result and the buffers' new values) and commit (the
    in-place updates): compute and commit are captured as two graphs, the commit's replayed only
    once the state is found unmoved; a replay dropped on a moved state commits nothing (the
    forward's own run does, once)."""
    mod = kwgraphs
    fake = FakeGraphs(monkeypatch, mod)
    w, buf, commits = torch.tensor([2.0, 3.0]), torch.zeros(2), []

    def later(work):  # run now, or record into the open capture
        fake.open.work.append(work) if fake.open is not None else work()

    def compute(x):  # result x * w + 1; the buffer's new value buf / 2 + x (a running average)
        out, new = torch.empty_like(x), torch.empty_like(x)

        def work():
            torch.mul(x, w, out=out)
            out.add_(1)
            torch.add(buf * 0.5, x, out=new)
        later(work)
        return out, (new,)

    def commit(new):
        def work():
            commits.append(1)
            buf.data.copy_(new)  # as a graph's write: the version does not move
        later(work)

    state, reads = (lambda: mod.stamp(w, buf)), (lambda: (w, buf))
    x, holder = torch.tensor([1.0, 1.0]), torch.nn.Module()
    call = lambda: mod.graphed(holder, "t", compute, (x,), state, reads, commit)  # noqa: E731
    expect = 0.0
    for n in range(4):  # a run and its capture (two graphs), then three replays of both
        assert call().tolist() == [3.0, 4.0]
        expect = expect / 2 + 1
        assert buf.tolist() == [expect, expect] and len(commits) == n + 1
    assert (fake.captures, fake.replays) == (2, 6)
    w.mul_(2)  # moved: the replay's values are dropped, the forward's own run commits once
    assert call().tolist() == [5.0, 7.0]
    expect = expect / 2 + 1
    assert buf.tolist() == [expect, expect] and len(commits) == 5
    assert (fake.captures, fake.replays) == (4, 7)
    buf.fill_(8.0)  # changed in place by the caller: the same, the update made once
    assert call().tolist() == [5.0, 7.0] and buf.tolist() == [5.0, 5.0] and len(commits) == 6
    assert (fake.captures, fake.replays) == (6, 8)
    assert call().tolist() == [5.0, 7.0] and buf.tolist() == [3.5, 3.5] and len(commits) == 7
    assert (fake.captures, fake.replays) == (6, 10)

    def waits(new):  # updates that cannot be captured: the forward runs as it is from then on
        if fake.open is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        commit(new)
    other = torch.nn.Module()
    buf.zero_()
    for n in range(3):
        assert mod.graphed(other, "t", compute, (x,), state, reads, waits).tolist() == [5.0, 7.0]
        assert buf.tolist() == [[1.0, 1.5, 1.75][n]] * 2 and fake.stream == "caller's"
    assert next(iter(mod.graphs_of(other).values())).graph is None and len(commits) == 10

# --- GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@gpu
def test_replay_matches_the_plain_forward_and_updates_running_stats_once_per_call(fake_clock, tmp_path):
    problem, mod, _ = _emit(fake_clock, tmp_path, "level2/conv2d_batch_norm_train_relu.py", "cuda")
    plain, graphed = _pair(problem, mod, "cuda")
    held = []
    with torch.no_grad():
        for seed in range(4):
            x = problem.make_inputs(seed, "cuda")
            want, got = plain(*x), graphed(*x)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            held.append((got, got.clone()))
    entry = next(iter(mod._kw_graphs_of(graphed).values()))
    assert len(mod._kw_graphs_of(graphed)) == 1 and entry.graph is not None
    assert entry.inputs is not None  # new input tensors each call: copied in once they moved twice
    for out, snapshot in held:  # later replays did not overwrite what earlier calls returned
        torch.testing.assert_close(out, snapshot, rtol=0, atol=0)
    for (name, a), (_, b) in zip(plain.named_buffers(), graphed.named_buffers()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6, msg=name)  # running stats: 4 updates each
    assert int(graphed.bn.num_batches_tracked) == 4


@pytest.mark.gpu
@gpu
def test_a_caller_reusing_its_inputs_and_dropping_results_gets_no_copies_until_it_keeps_one(fake_clock, tmp_path):
    problem, mod, _ = _emit(fake_clock, tmp_path, "level2/gemm_gelu_scale.py", "cuda")
    plain, graphed = _pair(problem, mod, "cuda")
    x = problem.make_inputs(0, "cuda")
    with torch.no_grad():
        graphed(*x)  # runs the forward, then captures it on x itself
        entry = next(iter(mod._kw_graphs_of(graphed).values()))
        assert entry.graph is not None and entry.inputs is None and entry.lend[0] is not None  # reads x where it is
        ptr = graphed(*x).data_ptr()  # replayed; the result is dropped at once
        y = graphed(*x)
        assert y.data_ptr() == ptr  # the graph's own output, lent again
        torch.testing.assert_close(y, plain(*x), rtol=0, atol=0)
        del y
        x[0].mul_(0.5)  # changed in place: the replay reads it where it is
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)
        assert next(iter(mod._kw_graphs_of(graphed).values())) is entry
        kept = graphed(*x)
        before = kept.clone()
        x[0].mul_(-1)
        again = graphed(*x)  # `kept` is still held: the graph must not write it again
        torch.testing.assert_close(kept, before, rtol=0, atol=0)
        torch.testing.assert_close(again, plain(*x), rtol=0, atol=0)
        entry = next(iter(mod._kw_graphs_of(graphed).values()))
        assert entry.graph is not None and entry.lend == [None]  # copies from now on for this caller
        third = graphed(*x)
        assert third.data_ptr() != entry.outputs[0].data_ptr()
        torch.testing.assert_close(third, again, rtol=0, atol=0)
        torch.testing.assert_close(kept, before, rtol=0, atol=0)
        gone = weakref.ref(x[0])  # the capture holds no reference to the caller's inputs
        x = [t.clone() for t in x]
        assert gone() is None
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)  # elsewhere: read there
        assert next(iter(mod._kw_graphs_of(graphed).values())).inputs is None
        x = [t.clone() for t in x]
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)  # elsewhere again: copied into buffers
        assert next(iter(mod._kw_graphs_of(graphed).values())).inputs is not None
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)


@pytest.mark.gpu
@gpu
def test_a_weight_changed_in_place_is_captured_again_and_a_new_shape_runs_the_original(fake_clock, tmp_path):
    problem, mod, _ = _emit(fake_clock, tmp_path, "level2/gemm_gelu_scale.py", "cuda", precision="bf16")
    plain, graphed = _pair(problem, mod, "cuda")
    x = problem.make_inputs(0, "cuda")
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)
        first = next(iter(mod._kw_graphs_of(graphed).values()))
        for m in (plain, graphed):  # the capture read the weight's bf16 copy: it must be redone
            next(m.parameters()).mul_(-2)
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)
        torch.testing.assert_close(graphed(*x), plain(*x), rtol=0, atol=0)
        assert next(iter(mod._kw_graphs_of(graphed).values())) is not first
        half = [t[: t.shape[0] // 2].contiguous() for t in x]
        torch.testing.assert_close(graphed(*half), plain(*half), rtol=0, atol=0)
        assert len(mod._kw_graphs_of(graphed)) == 1  # another shape: the original forward, not captured
    y = graphed(*x)  # autograd on: the original forward, nothing new is captured
    assert len(mod._kw_graphs_of(graphed)) == 1 and y.shape == plain(*x).shape
    twin = copy.deepcopy(graphed)  # a copy of a module with captures: its own parameters, its own graphs
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(twin(*x), plain(*x), rtol=0, atol=0)
    assert len(mod._kw_graphs_of(twin)) == 1


@pytest.mark.gpu
@gpu
def test_a_forward_that_waits_for_the_gpu_is_not_captured():
    holder = torch.nn.Module()
    state = lambda: ()  # noqa: E731
    calls = []

    def forward(x):
        calls.append(1)
        return x * float(x.sum().item())  # .item() waits: not capturable

    x = torch.randn(8, device="cuda")
    before = torch.cuda.current_stream()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(kwgraphs.graphed(holder, "t", forward, (x,), state), x * float(x.sum()))
            assert torch.cuda.current_stream() == before
    assert next(iter(kwgraphs.graphs_of(holder).values())).graph is None
    # the first two calls stop at the .item() (synchronizing operations raise then) and run again;
    # the third runs once: no capture is ever begun
    assert len(calls) == 5
    torch.randn(16, device="cuda")  # torch's CUDA generator is usable (a failed capture breaks it)
    torch.nn.functional.dropout(x, 0.5)


@pytest.mark.gpu
@gpu
def test_a_forward_that_waits_only_on_its_first_call_is_captured_on_its_second():
    """A per-version check (the causal mask's) waits for the GPU once, then hits its cache."""
    holder, seen = torch.nn.Module(), []

    def forward(x):
        if not seen:
            seen.append(float(x.sum()))
        return x * 2

    x = torch.randn(8, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(kwgraphs.graphed(holder, "t", forward, (x,), lambda: ()), x * 2)
    assert next(iter(kwgraphs.graphs_of(holder).values())).graph is not None


@pytest.mark.gpu
@gpu
def test_work_buffers_are_new_inside_a_capture():
    """Split reductions keep their partial results in a per-stream buffer (codegen/host.py
    `_scratch`); a capture gets its own, so graphs replayed on two streams never share one."""
    from kernelwright.codegen.host import _scratch

    dev = torch.device("cuda", torch.cuda.current_device())
    a = _scratch("part", (4, 8), dev)
    assert _scratch("part", (4, 8), dev) is a
    graph, inside = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        inside += [_scratch("part", (4, 8), dev), _scratch("part", (4, 8), dev)]
    assert all(b is not a for b in inside) and inside[0] is not inside[1]
    assert _scratch("part", (4, 8), dev) is a


@pytest.mark.gpu
@gpu
def test_training_steps_through_the_backend_replay_and_match_eager_at_every_step(tmp_path, monkeypatch):
    """torch.compile(backend="kernelwright") training a conv net with the replay chosen for every
    graph: each step's loss, gradients and running statistics equal eager's from the same weights,
    on a new input each step, while the caller keeps each step's output past the next forward
    (that output is then copied out); once the captures settle, both graphs replay every step
    (the backward reads the forward's saved tensors where the forward's replay leaves them)."""
    from kernelwright import backend as kwb
    from kernelwright.measure import final

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    pick = final.pick_forward

    def replay_chosen(timing, *a, **k):  # the replay whatever the timing says
        if pick(timing, *a, **k) or GRAPHS not in timing:
            return GRAPHS in timing
        timing["cuda_graphs"], timing["cuda_graphs_why"], timing["kernelwright"] = True, "faster", timing[GRAPHS]
        return True
    monkeypatch.setattr(final, "pick_forward", replay_chosen)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    eager = Net().cuda().train()
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=kwb.backend(budget_trials=1), dynamic=False)
    kept, replays = [], [0]
    replay = torch.cuda.CUDAGraph.replay

    def counted(graph):
        replays[0] += 1
        return replay(graph)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)
    steps = 12  # (at 8 steps on an H100 the captures settled during the eighth: 3 replays in the last two)
    for step in range(steps):
        if step == steps - 2:
            replays[0] = 0
        x = torch.randn(4, 3, 8, 8, device="cuda")
        for m in (eager, model):
            m.zero_grad(set_to_none=True)
        want = eager(x)
        want.square().mean().backward()
        got = compiled(x)
        got.square().mean().backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        kept.append((got, got.detach().clone()))
        for (name, a), b in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=f"step {step}: {name}")
        for (name, a), b in zip(eager.named_buffers(), model.buffers()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name}")
        with torch.no_grad():
            for a, b in zip(eager.parameters(), model.parameters()):
                b.copy_(a)  # the same weights for the next step
    for out, snapshot in kept:  # no replay wrote over an output the caller kept
        torch.testing.assert_close(out, snapshot, rtol=0, atol=0)
    assert replays[0] >= 2 * 2, replays  # the last two steps replayed the forward and the backward
    torch._dynamo.reset()
