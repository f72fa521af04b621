"""The GPU-only branches of optimize (search with timings, library comparison, GEMM fusion,
emission of the winners) exercised on the CPU with a fake timer: kernels run in the Triton
interpreter and are verified for real; only the clock is fake."""
import os

import pytest
import torch

from kernelwright.capture import capture
from kernelwright.emit.module import import_model_new, ModeForward, render_model_new, write_module
from kernelwright.pipeline import Options
from kernelwright.search.plan_search import tune_plan
from kernelwright.plan import plan_graph
from kernelwright.plan.rewrites import rewrite
from kernelwright.policy import get_policy
from kernelwright.problem import load_problem
from kernelwright.search import TrialDB

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(fake_clock, tmp_path, name, library_ms, kernel_ms, precision="fp32", lt_ms=None):
    """optimize's planning and search (rewrites included, as in pipeline.optimize_problem) on the
    fake clock."""
    fake_clock(library_ms, kernel_ms, lt_ms)
    problem = load_problem(os.path.join(ROOT, "problems", name), small=True)
    plan = plan_graph(rewrite(capture(problem), precision)[0])
    result = {"groups": []}
    opts = Options(device="cpu", budget_trials=6, db_path=str(tmp_path / "db.jsonl"), log=lambda s: None)
    summary, kernels, sources, _ = tune_plan(problem, plan, get_policy(precision), torch.device("cpu"), True,
                                             tmp_path / ".build", opts, result)
    return problem, plan, result, kernels, sources


def test_library_wins_when_it_is_faster(fake_clock, tmp_path):
    _, _, result, kernels, _ = _run(fake_clock, tmp_path, "level2/gemm_gelu_scale.py", 0.5, 1.0)
    kinds = {g["kind"] for g in result["groups"]}
    assert "gemm_epilogue" in kinds and "pointwise" in kinds
    assert all(g["strategy"] == "library" and g["library_ms"] == 0.5 for g in result["groups"])
    assert kernels == {}
    # every implementation of a unit is a choice timed alike: the library call and each template
    for g in result["groups"]:
        assert g["choices"][0] == {"choice": "library", "time_ms": 0.5, "trials": 0, "failed": 0}
        others = g["choices"][1:]
        assert others and all(c["time_ms"] == 1.0 and c["trials"] >= 1 for c in others), g["choices"]
        assert sum(c["trials"] for c in others) == g["trials"]
    assert len(TrialDB(str(tmp_path / "db.jsonl")).records()) > 0  # every trial is recorded


def test_faster_kernels_are_emitted_and_still_correct(fake_clock, tmp_path):
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, "level2/gemm_gelu_scale.py", 5.0, 1.0)
    fused = [g for g in result["groups"] if g["kind"] == "gemm_epilogue"]
    assert fused and fused[0]["strategy"] == "triton" and fused[0]["time_ms"] == 1.0
    gemm = next(u.node for u in plan.units if u.node and "addmm" in u.node)
    assert kernels[gemm] is None  # the fused GEMM computes it
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "fp32", None), sources)
    assert "addmm" not in path.read_text().split("def _kw_tensors", 1)[1]
    mod = import_model_new(path)
    ref = problem.make_model()
    new = mod.ModelNew(*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(3)
    torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-5)


def test_node_templates_and_groups_share_the_budget(fake_clock, tmp_path):
    _, _, result, kernels, _ = _run(fake_clock, tmp_path, "level2/conv2d_max_pool_hardswish.py", 5.0, 1.0)
    by_kind = {g["kind"]: g for g in result["groups"]}
    assert by_kind["node"]["trials"] >= 1
    strategies = {g["id"]: g["strategy"] for g in result["groups"]}
    assert strategies.get("convolution_nobias") == "torch"  # channels-last variant "won" on the fake clock
    assert strategies.get("max_pool2d_with_indices") == "triton"
    assert sum(g["trials"] for g in result["groups"]) <= 6 + len(result["groups"])


def test_cuda_candidates_join_the_search_and_fail_as_data_without_a_gpu(fake_clock, tmp_path):
    """On the fake clock the CUDA C++ candidates are built and launched; with no GPU every launch
    fails, which is recorded as a failed trial, and the Triton kernel wins the group."""
    _, _, result, kernels, sources = _run(fake_clock, tmp_path, "level1/softmax.py", 5.0, 1.0)
    (g,) = result["groups"]
    assert g["strategy"] == "triton" and g["failed"] >= 1
    errors = [r for r in TrialDB(str(tmp_path / "db.jsonl")).records() if r.get("template", "").startswith("cuda.")]
    assert errors and all(r["error"] for r in errors)


@pytest.mark.parametrize("name", ["level2/gemm_bias_relu.py", "level2/gemm_gelu_scale.py"])
def test_gemm_epilogue_library_path_runs(fake_clock, tmp_path, name):
    """The library side of a GEMM-epilogue comparison gets every value the epilogue reads (the
    bias split off an addmm is an epilogue input, not a GEMM input), and the fused kernel wins on
    the fake clock."""
    _, _, result, _, _ = _run(fake_clock, tmp_path, name, 5.0, 1.0)
    fused = [g for g in result["groups"] if g["kind"] == "gemm_epilogue"]
    assert fused and fused[0]["strategy"] == "triton", fused
    assert fused[0]["library_ms"] == 5.0


@pytest.mark.parametrize("name", ["level2/gemm_bias_relu.py", "level3/mlp.py"])
def test_bf16_gemm_absorbs_its_operand_casts(fake_clock, tmp_path, name):
    """Under bf16 a fused GEMM reads the float32 activation and rounds its tiles to bf16 itself
    (the cast group it absorbs is not emitted); the weight's bf16 copy is made once per parameter
    version and read as it is; the module still matches the float64 model within the policy's
    tolerance."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, name, 5.0, 1.0, "bf16")
    fused = [g for g in result["groups"] if g["kind"] == "gemm_epilogue"]
    assert fused and all(g["strategy"] == "triton" for g in fused)
    first = fused[0]
    assert first["id"].count("+") == 2 and first["ops"][0] == "_to_copy"  # the cast of x
    absorbed = [k for k, v in kernels.items() if v is None and k.startswith("g")]
    assert len(absorbed) >= 1
    text = render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "bf16", None)
    path = write_module(tmp_path / "out", text, sources)
    body = path.read_text().split("def _kw_tensors", 1)[1]
    assert "aten.mm" not in body and "torch.mm(" not in body and "x_bf16" not in body
    assert "permute_bf16" in body and "_kw_cache" not in body  # the weight cast, made every call
    mod = import_model_new(path)
    ref = problem.make_model().double()
    new = mod.ModelNew(*problem.get_init_inputs())
    new.load_state_dict(problem.make_model().state_dict())
    x = problem.make_inputs(3)
    with torch.no_grad():  # (with gradients on, the module runs the original forward)
        out = new(*x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref(*[t.double() for t in x]), rtol=2e-2, atol=2e-2)


def _assert_matches_float64_model(problem, path, precision):
    """The emitted module at `path`, with the model's weights, against the model in float64."""
    mod = import_model_new(path)
    ref = problem.make_model().double()
    new = mod.ModelNew(*problem.get_init_inputs())
    new.load_state_dict(problem.make_model().state_dict())
    x = problem.make_inputs(3)
    tol = 2e-2 if precision == "bf16" else 1e-4
    torch.testing.assert_close(new(*x).double(), ref(*[t.double() for t in x]), rtol=tol, atol=tol)


@pytest.mark.parametrize("name, precision", [("level2/gemm_bias_relu.py", "bf16"), ("level3/mlp.py", "bf16"),
                                             ("level2/gemm_bias_relu.py", "fp32")])
def test_cublaslt_bias_relu_epilogue_wins_when_faster(fake_clock, tmp_path, name, precision):
    """A Linear + ReLU whose cuBLASLt-epilogue candidate measures fastest ships as one
    torch._addmm_activation call (a library call: strategy "torch"); under bf16 it takes over the
    activation's cast (not emitted) and the module still matches the float64 model."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, name, 5.0, 1.0, precision, lt_ms=0.5)
    fused = [g for g in result["groups"] if g["kind"] == "gemm_epilogue"]
    lt = [g for g in fused if g["strategy"] == "torch"]
    assert lt and all(g["config"] == {"epilogue": "lt"} and g["time_ms"] == 0.5 for g in lt)
    assert len(lt) == (3 if "mlp" in name else 1)
    text = render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], precision, None)
    path = write_module(tmp_path / "out", text, sources)
    assert sum(s.count("torch._addmm_activation(") for s in sources.values()) == len(lt)
    body = path.read_text().split("def _kw_tensors", 1)[1]
    assert "x_bf16" not in body
    _assert_matches_float64_model(problem, path, precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["gemm_sigmoid_sum", "gemm_layer_norm", "gemm_group_norm_swish"])
def test_gemm_and_row_reduction_ship_as_one_kernel_when_faster(fake_clock, tmp_path, precision, name):
    """The shrunk gemm_sigmoid_sum (row sum), gemm_layer_norm and gemm_group_norm_swish (the norm
    on whole rows / row segments in one tile): the GEMM with its row reduction folded in wins on
    the fake clock; the emitted forward runs it in place of the GEMM and the reduction group and
    matches the float64 model."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, f"level2/{name}.py", 5.0, 1.0,
                                                   precision)
    (fused,) = [g for g in result["groups"] if g["kind"] == "gemm_rowreduce"]
    assert fused["strategy"] == "triton" and fused["config"]["BLOCK_M"] >= 16
    gemm = next(u.node for u in plan.units if u.node and "mm" in u.node)
    assert kernels[gemm] is None
    mode = "sum" if name == "gemm_sigmoid_sum" else "tile"
    assert sum(f"reduce={mode!r}" in text for text in sources.values()) == 1
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], precision, None), sources)
    body = path.read_text().split("def _kw_tensors", 1)[1]
    assert "torch.mm(" not in body and "torch.addmm(" not in body
    _assert_matches_float64_model(problem, path, precision)


def test_weight_only_values_follow_every_change_of_a_weight(fake_clock, tmp_path):
    """The forward recomputes a weight's bf16 copy every call: results follow the current weights
    when a parameter changes in place, through `.data` (which moves no version counter), or is
    replaced."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, "level2/gemm_bias_relu.py", 0.5, 1.0, "bf16")
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "bf16", None), sources)
    new = import_model_new(path).ModelNew(*problem.get_init_inputs())
    ref = problem.make_model()
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(3)

    def check():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = ref(*x)
        got = new(*x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        return got

    with torch.no_grad():
        first = check()
        new.fc.weight.mul_(2.0)  # in place: the version moves
        ref.fc.weight.mul_(2.0)
        check()
        new.fc.weight.data.mul_(-1.0)  # through .data: no version moves
        ref.fc.weight.data.mul_(-1.0)
        check()
        new.fc.weight.data.copy_(torch.randn_like(new.fc.weight))
        ref.fc.weight.data.copy_(new.fc.weight)
        check()
        new.fc.weight = torch.nn.Parameter(torch.zeros_like(new.fc.weight))  # replaced
        torch.testing.assert_close(new(*x).float(), torch.relu(new.fc.bias).expand_as(first).float(),
                                   rtol=1e-2, atol=1e-2)


def test_final_timing_runs_the_emitted_module(fake_clock, monkeypatch, tmp_path):
    """optimize's last step on a GPU: the verified ModelNew (the reference's weights) is timed
    beside eager; here with a fake time_problem that calls every candidate once."""
    from kernelwright.measure import baselines
    from kernelwright.measure.timer import Timing
    from kernelwright.pipeline import _final_checks

    problem, plan, _, kernels, sources = _run(fake_clock, tmp_path, "level2/gemm_bias_relu.py", 1.0, 0.5)
    text = render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "fp32", None)
    path = write_module(tmp_path / "out", text, sources)
    called = {}

    def fake_time_problem(problem, policy, device, candidates, **kw):
        x = problem.make_inputs(0, device)
        called.update({k: fn(*x) for k, fn in candidates.items()})
        t = baselines.Timings(eager=Timing.from_samples([2.0]), kernelwright=Timing.from_samples([1.0]))
        return t

    monkeypatch.setattr(baselines, "time_problem", fake_time_problem)
    v, timing = _final_checks(problem, path, get_policy("fp32"), torch.device("cpu"), True, lambda s: None)
    assert v["passed"] and set(called) == {"kernelwright"}
    torch.testing.assert_close(called["kernelwright"], problem.make_model("cpu")(*problem.make_inputs(0, "cpu")))
    assert timing["speedup_vs_eager"] == 2.0


def test_final_timing_against_another_compile_mode(fake_clock, monkeypatch, tmp_path):
    """--compile-mode reduce-overhead: the baseline is timed in that mode and keyed "compile"
    (with timing["compile_mode"] naming it), so speedups and bench summaries read it as compile."""
    from kernelwright.emit.report import render_report
    from kernelwright.measure import baselines
    from kernelwright.measure.timer import Timing
    from kernelwright.pipeline import _final_checks

    problem, plan, _, kernels, sources = _run(fake_clock, tmp_path, "level2/gemm_bias_relu.py", 1.0, 0.5)
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "fp32", None), sources)
    modes = []

    def fake_time_problem(problem, policy, device, candidates, compile_mode="default", **kw):
        modes.append(compile_mode)
        t = baselines.Timings(eager=Timing.from_samples([2.0]), kernelwright=Timing.from_samples([1.0]))
        t["compile"] = Timing.from_samples([3.0])  # time_problem keys it so in any mode
        t.errors["other"] = "x"
        return t

    monkeypatch.setattr(baselines, "time_problem", fake_time_problem)
    _, timing = _final_checks(problem, path, get_policy("fp32"), torch.device("cpu"), True, lambda s: None,
                              compile_mode="reduce-overhead")
    assert modes == ["reduce-overhead"] and timing["compile_mode"] == "reduce-overhead"
    assert timing["compile"]["median_ms"] == 3.0 and "compile:reduce-overhead" not in timing
    assert timing["speedup_vs_compile"] == 3.0
    text = render_report({"problem": "p", "precision": "fp32", "device": "cuda", "capture": "ok", "groups": [],
                          "timing": timing})
    assert "speedup over compile (mode reduce-overhead): **3.00x**" in text


def test_weight_only_units_run_first(fake_clock, tmp_path):
    """mlp under bf16 casts three weights: the casts run ahead of every unit that reads an input,
    with no version check or cache; views and library calls go through the Python API
    (emit.program.FAST_CALLS), not torch.ops."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, "level3/mlp.py", 0.5, 1.0, "bf16")
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "bf16", None), sources)
    body = path.read_text().split("def _kw_forward", 1)[1]
    assert "_kw_stamp(" not in body and "_kw_cache" not in body
    lines = body.splitlines()
    first_input_use = next(i for i, ln in enumerate(lines) if "(x" in ln.replace(" ", "") or "(x," in ln)
    casts = [i for i, ln in enumerate(lines) if ln.strip().startswith("permute") and "_bf16 = " in ln]
    assert len(casts) >= 3 and max(casts) < first_input_use  # the weights' casts come first
    assert "torch.ops.aten.permute" not in body and ".permute([1, 0])" in body
    new = import_model_new(path).ModelNew(*problem.get_init_inputs())
    ref = problem.make_model()
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(*x)
    with torch.no_grad():
        torch.testing.assert_close(new(*x).float(), want.float(), rtol=3e-2, atol=3e-2)


def test_batch_norm_counters_are_added_in_place(fake_clock, tmp_path):
    """num_batches_tracked += 1 of every training batch norm: one in-place _foreach_add_ at the end
    of the forward, not a sum per counter copied back; the module's buffers follow eager's."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, "level3/resnet_basic_block.py", 0.5, 1.0)
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])], "fp32", None), sources)
    body = path.read_text().split("def _kw_tensors", 1)[1]
    assert body.count("torch._foreach_add_([") == 1 and "num_batches_tracked, 1)" not in body
    new = import_model_new(path).ModelNew(*problem.get_init_inputs())
    ref = problem.make_model()
    new.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for seed in (1, 2):
            x = problem.make_inputs(seed)
            torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-4)
    for name, buf in ref.named_buffers():
        torch.testing.assert_close(dict(new.named_buffers())[name], buf, rtol=1e-5, atol=1e-6)
    assert int(new.bn1.num_batches_tracked) == int(new.bn2.num_batches_tracked) == 2


def test_normalization_groups_also_try_their_apply_pass_reversed(tmp_path):
    """A split schedule's apply pass walked last tile first (APPLY_REVERSE) is seeded right after
    the leading split seeds of a normalization group, and verifies like them."""
    from kernelwright.problem import from_module
    from kernelwright.capture.execute import run_graph
    from kernelwright.search.units import GroupTuner
    from kernelwright.space.config import Config

    class Center(torch.nn.Module):
        def forward(self, x):
            return x - x.mean(-1, keepdim=True)

    x = torch.randn(2, 65536)  # two long rows: a split reduction
    graph = capture(from_module(Center(), [x]))
    group = plan_graph(graph).groups[0]
    assert group.kind == "normalization"
    with torch.no_grad():
        env = run_graph(graph, Center(), [x], keep=True)
    tuner = GroupTuner(graph, group, env, get_policy("fp32"), torch.device("cpu"), tmp_path, False)
    rev = [c for c in tuner.seeds if c.get("APPLY_REVERSE")]
    assert len(rev) == 2 and all(c in tuner.space for c in rev)
    for c in rev:
        plain = Config(c.template, tuple(kv for kv in c.params if kv[0] != "APPLY_REVERSE"))
        assert tuner.seeds.index(plain) < tuner.seeds.index(c)
    results = tuner.run(rev[:1])
    assert results[0].error == "untimed: no GPU" and results[0].excess is not None


def test_groups_that_change_layout_search_tiles_only(tmp_path):
    """A pointwise group reading channels-last data and writing NCHW (conv2d_relu_bias_add under
    tf32) searches the tiled transpose schedules only, and they verify."""
    from kernelwright.capture.execute import run_graph
    from kernelwright.codegen.triton_group import lower, transposed_walk
    from kernelwright.search.units import GroupTuner

    problem = load_problem(os.path.join(ROOT, "problems", "level2", "conv2d_relu_bias_add.py"), small=True)
    plan = plan_graph(rewrite(capture(problem), "tf32")[0])
    group = next(g for g in plan.groups if g.rdims is None and transposed_walk(lower(plan.graph, g)) is not None)
    with torch.no_grad():
        env = run_graph(plan.graph, problem.make_model(), problem.make_inputs(0), keep=True)
    tuner = GroupTuner(plan.graph, group, env, get_policy("tf32"), torch.device("cpu"), tmp_path, False)
    assert len(tuner.space) > 8 and {c.template for c in tuner.space} == {"triton.tiled"}
    assert set(tuner.seeds) <= set(tuner.space) and tuner.default in tuner.space
    results = tuner.run(tuner.seeds)
    assert all(r.error == "untimed: no GPU" and r.excess is not None for r in results)


def test_units_computed_from_the_weights_alone_get_one_trial(fake_clock, tmp_path):
    """bf16 gemm_gelu_scale: the weight's bf16 cast runs once per weight version (the forward caches
    it), so the search times one config of it and gives the per-call units the rest."""
    from kernelwright.plan.weights import weight_only, weight_roots

    _, plan, result, _, _ = _run(fake_clock, tmp_path, "level2/gemm_gelu_scale.py", 5.0, 1.0, precision="bf16")
    graph, roots = plan.graph, weight_roots(plan.graph)
    once = {u.name for u in plan.units if weight_only(graph, u.outputs, roots)}
    trials = {g["id"]: g["trials"] for g in result["groups"]}
    once &= set(trials)  # the tuned ones (a view of a weight has nothing to tune)
    assert once  # the weight's bf16 cast
    assert all(trials[k] == 1 for k in once), trials
    per_call = [k for k in trials if k not in once and "+" not in k]  # (the fused GEMM pass has its own)
    assert per_call and all(trials[k] >= 2 for k in per_call), trials
    assert not weight_only(graph, list(graph.outputs), roots)  # a returned value is never weight-only


def test_a_choice_whose_template_refuses_the_unit_is_listed_with_why(fake_clock, tmp_path, monkeypatch):
    """Each unit's generated choices are named records; one whose tuner cannot be built for the
    unit stays in result.json's choices with the reason, and the others are searched."""
    from kernelwright.codegen.triton_group import Unsupported
    from kernelwright.search import plan_search

    def refuse(*a, **k):
        raise Unsupported("no CUDA row kernel for this group here")

    monkeypatch.setattr(plan_search, "CudaTuner", refuse)
    _, _, result, _, _ = _run(fake_clock, tmp_path, "level1/softmax.py", 5.0, 1.0)
    (g,) = result["groups"]
    assert g["strategy"] == "triton"
    names = [c["choice"] for c in g["choices"]]
    assert names[0] == "library" and any(n.startswith("triton.") for n in names[1:]), names
    (refused,) = [c for c in g["choices"] if "refused" in c]
    assert refused == {"choice": "cuda.row", "time_ms": None, "trials": 0, "failed": 0,
                       "refused": "no CUDA row kernel for this group here"}


def test_a_rerun_reuses_the_final_timing_of_the_same_files(tmp_path, monkeypatch):
    """The final timing of emitted files is kept in the trial database; a second check of the same
    files on the same GPU verifies the module and reports that timing (marked reused) without timing
    again, while --retune or any changed byte of kernels/ measures again."""
    from kernelwright.measure import baselines
    from kernelwright.measure.timer import Timing
    from kernelwright.pipeline import _final_checks, _store, optimize_problem

    problem = load_problem(os.path.join(ROOT, "problems", "level2", "conv2d_mish_mish.py"), small=True)
    opts = Options(device="cpu", budget_trials=1, small=True, db_path=str(tmp_path / "db.sqlite"), log=lambda s: None)
    optimize_problem(problem, tmp_path / "out", opts)
    path = tmp_path / "out" / "model_new.py"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake-gpu")
    calls = []

    def fake_time_problem(problem, policy, device, candidates=None, **kw):
        calls.append(sorted(candidates))
        t = baselines.Timings({k: Timing(ms, ms, ms, 0.0, 50) for k, ms in
                               (("eager", 3.0), ("compile", 2.0), ("kernelwright", 1.0))})
        return t

    monkeypatch.setattr(baselines, "time_problem", fake_time_problem)
    policy, cpu, log = get_policy("fp32"), torch.device("cpu"), []

    def check(retune=False):
        store = _store(problem, Options(**{**opts.__dict__, "retune": retune}), policy, cpu, True, "any",
                       dict(problem._module.SMALL))
        return _final_checks(problem, path, policy, cpu, True, log.append, store=store)

    v, first = check()
    assert v["passed"] and len(calls) == 1 and "reused" not in first and first["speedup_vs_compile"] == 2.0
    v, again = check()
    assert v["passed"] and len(calls) == 1  # verified, not timed
    assert again["reused"]["measured"] and again["kernelwright"] == first["kernelwright"]
    assert any(line.startswith("timing: reused") for line in log)
    assert again["speedup_vs_compile"] == 2.0
    check(retune=True)
    assert len(calls) == 2
    kernel = next((tmp_path / "out" / "kernels").glob("g*.py"))
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    _, fresh = check()
    assert len(calls) == 3 and "reused" not in fresh


def test_a_strided_transposed_convolution_tries_its_subpixel_forward_form(fake_clock, tmp_path):
    """The stride-2 transposed convolution's choices on the fake clock: the library call, its
    forward-convolution forms (torch.conv_transpose_as_conv), its channels-last variant and the
    Triton template, each verified; the emitted forward matches Model whichever wins."""
    problem, plan, result, kernels, sources = _run(fake_clock, tmp_path, "level2/conv_transpose2d_add_gelu.py",
                                                   5.0, 1.0)
    (row,) = [g for g in result["groups"] if g["kind"] == "node" and g["ops"] == ["convolution"]]
    forms = {c["choice"]: c for c in row["choices"]}
    # its two forms (one forward convolution over the phases, one per phase), each verified
    assert forms["torch.conv_transpose_as_conv"]["trials"] == 2 and forms["torch.conv_transpose_as_conv"]["failed"] == 0
    path = write_module(tmp_path / "out", render_model_new(problem, [ModeForward("any", plan, kernels, sources, [])],
                                                           "fp32", None), sources)
    mod = import_model_new(path)
    ref = problem.make_model()
    new = mod.ModelNew(*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = problem.make_inputs(3)
    with torch.no_grad():  # (with gradients the module runs the original forward)
        torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-5)
    assert not mod._KW_WARNED
