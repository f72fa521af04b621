"""kernelwright as a torch.compile backend (kernelwright/backend.py), on the CPU (Triton
interpreter): eval graphs optimised and verified, the state Dynamo lifts into inputs put back on a
module, recompiles at another batch size, training graphs through AOTAutograd (forward and
backward optimised), failures run as captured, and results cached per graph across processes."""
import json
import warnings

import pytest
import torch

from kernelwright import backend as kwb

pytestmark = pytest.mark.interpreter


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture
def net(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2.0)
    yield m
    torch._dynamo.reset()


def _results(tmp_path):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "kernelwright" / "compiled").glob("*/result.json"))]


def test_the_backend_is_registered_by_name():
    assert "kernelwright" in torch._dynamo.list_backends()


def test_eval_graphs_are_optimised_and_match_eager_at_two_batch_sizes(net, tmp_path):
    """With dynamic=False each batch size is a graph of its own, optimised and verified (Dynamo's
    default would make the second one symbolic: specialised per size, tested below)."""
    compiled = torch.compile(net, backend="kernelwright", dynamic=False)
    with torch.no_grad():
        for batch in (2, 3):  # the second batch size recompiles
            x = torch.randn(batch, 3, 8, 8)
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)
    results = _results(tmp_path)
    assert len(results) >= 2 and all(r["verify"]["passed"] for r in results)
    assert any(g["strategy"] == "triton" for r in results for g in r["groups"])  # a generated kernel runs
    with torch.no_grad():  # the live state is read: a changed parameter changes the result
        net.fc.bias.add_(1.0)
        x = torch.randn(2, 3, 8, 8)
        torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)


def test_training_graphs_go_through_aot_autograd_forward_and_backward_optimised(net, tmp_path):
    """A graph that needs gradients: AOTAutograd's forward graph (batch norm in train mode fused
    with the ReLU here) and backward graph (its fused backward ops decomposed, so the ReLU's and the
    norm's gradients fuse; the input's None gradient kept out of the captured outputs) are each
    optimised and verified; the outputs, the gradients and the running statistics equal eager's."""
    net.train()
    ref = Net().train()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = torch.compile(net, backend="kernelwright")(x)
        out.sum().backward()
    assert not any("kernelwright" in str(w.message) for w in seen)
    want = ref(x)
    want.sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for a, b in ((net.conv.weight.grad, ref.conv.weight.grad), (net.bn.weight.grad, ref.bn.weight.grad),
                 (net.fc.bias.grad, ref.fc.bias.grad), (net.bn.running_var, ref.bn.running_var)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert net.bn.num_batches_tracked.item() == 1
    results = _results(tmp_path)
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)  # forward and backward
    groups = [g for r in results for g in r["groups"] if g["strategy"] == "triton"]
    assert any("_native_batch_norm_legit_functional" in g["ops"] for g in groups)  # forward: norm + ReLU
    # backward: ReLU's gradient (threshold_backward, decomposed to where) fused with the batch norm's
    assert any("where" in g["ops"] and "sum" in g["ops"] for g in groups)


def test_with_recompute_the_gradient_kernel_computes_the_relu_mask_again(net, tmp_path):
    """Options.recompute (off by default): the backward's gradient after the per-channel sums computes
    where(mask, 0, grad) again (plan.recompute) instead of reading it from the reduction kernel,
    and the gradients still equal eager's."""
    net.train()
    ref = Net().train()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(2, 3, 8, 8)
    torch.compile(net, backend=kwb.backend(recompute=True))(x).sum().backward()
    ref(x).sum().backward()
    for a, b in ((net.conv.weight.grad, ref.conv.weight.grad), (net.bn.weight.grad, ref.bn.weight.grad)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    results = _results(tmp_path)
    assert all(r["verify"]["passed"] for r in results)
    assert any(n.startswith("where") and "computed again where it is read" in n for r in results for n in r["rewrites"])


class ConstantMin(torch.nn.Module):
    """KernelBench level-2 31's forward: a tensor made from a Python number inside the forward,
    which Dynamo hands over as a plain tensor attribute of its graph module."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bias = torch.nn.Parameter(torch.randn(4, 1, 1))

    def forward(self, x):
        return torch.min(self.conv(x), torch.tensor(0.5)) + self.bias


def test_a_tensor_made_in_the_forward_is_captured_in_eval_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    model, x = ConstantMin().eval(), torch.randn(2, 3, 8, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(model, backend=kwb.backend())(x), model(x), rtol=1e-4, atol=1e-5)
    assert not any("kernelwright" in str(w.message) for w in seen), [str(w.message) for w in seen]
    assert [r["verify"]["passed"] for r in _results(tmp_path)] == [True]


def test_a_failure_runs_the_graph_as_captured_and_a_verified_result_is_reused(net, tmp_path, monkeypatch):
    import kernelwright

    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.compile(net, backend=kwb.backend())(x)  # optimised and cached
    torch._dynamo.reset()

    def fail(*a, **k):
        raise RuntimeError("optimize was called")

    monkeypatch.setattr(kernelwright, "optimize", fail)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(net, backend=kwb.backend())(x), net(x), rtol=1e-4, atol=1e-5)
    assert not any("kernelwright" in str(w.message) for w in seen)  # the cached module ran
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        other = torch.compile(net, backend=kwb.backend(budget_trials=3))  # other options: not cached
        torch.testing.assert_close(other(x), net(x))
    assert any("optimisation failed (RuntimeError: optimize was called)" in str(w.message) for w in seen)


def test_a_graph_that_keeps_its_captured_form_says_why_in_one_warning(net, tmp_path, monkeypatch):
    import kernelwright.pipeline as pipeline
    from kernelwright.capture import CaptureError, export

    def fail(problem, *a, **k):
        raise CaptureError("torch.export failed: RuntimeError: found two different devices meta, cuda:0")

    monkeypatch.setattr(pipeline, "capture", fail)
    monkeypatch.setattr(export, "capture", fail)  # (capture.modes captures through the module)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(net, backend=kwb.backend())(x), net(x), rtol=1e-4, atol=1e-5)
    said = [str(w.message) for w in seen if "kernelwright" in str(w.message)]
    assert said == ["kernelwright: a graph keeps its captured form (eval mode: capture: torch.export failed: RuntimeError: "
                    "found two different devices meta, cuda:0)"]
    (result,) = _results(tmp_path)
    assert kwb.kept_original(next((tmp_path / "kernelwright" / "compiled").iterdir())) is not None
    assert not result["groups"]


def test_kept_original_reads_each_way_a_mode_falls_back(tmp_path):
    assert kwb.kept_original(tmp_path) is None  # (no result.json)
    cases = {
        "eval mode: the generated forward took 1.811 ms, the graph as captured 1.598 ms":
            {"eval": {"capture": "ok", "whole_model_fallback": {"generated_ms": 1.811, "eager_ms": 1.598}}},
        "the generated forward failed verification (excess 2.0)":
            {"any": {"capture": "ok", "verify_fallback": {"passed": False, "reason": "excess 2.0"}}},
        None: {"any": {"capture": "ok", "verify": {"passed": True}}},
    }
    for want, modes in cases.items():
        (tmp_path / "result.json").write_text(json.dumps({"modes": modes}))
        assert kwb.kept_original(tmp_path) == want


def test_state_positions_and_the_lifted_module():
    gm = torch.fx.symbolic_trace(lambda w, x: x * w)
    w = torch.nn.Parameter(torch.ones(3))
    assert kwb.state_positions(gm, [w, torch.zeros(3)]) == [0]
    lifted = kwb.Lifted(gm, [w, torch.zeros(3)], [0])
    assert [n for n, _ in lifted.named_parameters()] == ["s0"]
    torch.testing.assert_close(lifted(torch.full((3,), 2.0)), torch.full((3,), 2.0))


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention and a GELU MLP, each with a residual."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def test_a_transformer_blocks_training_step_matches_eager(tmp_path, monkeypatch):
    """Forward and backward of a transformer block under the backend: every parameter's gradient
    equals eager's, and both graphs run generated kernels (norm, GELU and their gradients)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, ref = Block(), Block()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = torch.compile(model, backend="kernelwright")(x)
        out.sum().backward()
    torch._dynamo.reset()
    assert not any("kernelwright" in str(w.message) for w in seen)  # (both graphs ship generated forwards)
    want = ref(x)
    want.sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    results = _results(tmp_path)
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)
    assert all(any(g["strategy"] == "triton" for g in r["groups"]) for r in results)


def test_a_graph_with_symbolic_sizes_is_specialised_per_size_up_to_a_bound(net, tmp_path, monkeypatch):
    """dynamic=True hands over sizes as SymInt inputs (and a batch norm's eps and momentum as 0-d
    tensors): each batch size gets a graph optimised for it on first use, a size met again reuses
    its own, and past the bound further sizes run as captured with one warning."""
    compiled = torch.compile(net, backend="kernelwright", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (2, 3, 2):
            x = torch.randn(batch, 3, 8, 8)
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)
    assert not any("kernelwright" in str(w.message) for w in seen)
    results = _results(tmp_path)
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)
    assert any(g["strategy"] == "triton" for r in results for g in r["groups"])
    torch._dynamo.reset()
    monkeypatch.setattr(kwb, "MAX_SPECIALISATIONS", 1)
    compiled = torch.compile(net, backend="kernelwright", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (2, 4, 5):
            x = torch.randn(batch, 3, 8, 8)
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-5)
    assert [str(w.message) for w in seen if "kernelwright" in str(w.message)] == [
        "kernelwright: a graph with symbolic sizes met more than 1 sizes; calls at further sizes run the graph "
        "as captured"]
    assert len(_results(tmp_path)) == 2  # (batch 2 was cached on disk; 4 and 5 ran as captured)


def test_training_graphs_with_symbolic_sizes_are_specialised_forward_and_backward(net, tmp_path):
    """Under dynamic=True AOTAutograd's forward graph also returns sizes for its backward graph:
    each batch size specialises both (the sizes fixed), and gradients equal eager's at each. A
    training graph's first call runs under a dispatch mode of AOTAutograd's own: the
    specialisation made then is optimised outside it, so its capture (torch.export) succeeds and
    each size's forward and backward ship their generated code, without a warning."""
    net.train()
    ref = Net().train()
    ref.load_state_dict(net.state_dict())
    compiled = torch.compile(net, backend="kernelwright", dynamic=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (2, 3):
            x = torch.randn(batch, 3, 8, 8)
            out = compiled(x)
            out.sum().backward()
            want = ref(x)
            want.sum().backward()
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
            for a, b in ((net.conv.weight.grad, ref.conv.weight.grad), (net.bn.running_var, ref.bn.running_var)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    said = [str(w.message) for w in seen if "kernelwright" in str(w.message)]
    assert not said, said
    results = _results(tmp_path)
    assert len(results) == 4 and all(r["verify"]["passed"] for r in results)  # forward and backward, per size
    assert all(m["capture"] == "ok" for r in results for m in r["modes"].values())


def test_the_transformer_blocks_training_forward_ships_its_generated_forward(tmp_path, monkeypatch):
    """On the CPU AOTAutograd's forward graph calls _scaled_dot_product_flash_attention_for_cpu, whose
    torch decomposition returns the attention weights where the op returns its logsumexp: the
    capture keeps the op whole, so the generated forward passes verification and ships."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    torch.compile(Block(), backend="kernelwright")(torch.randn(2, 8, 16)).sum().backward()
    torch._dynamo.reset()
    assert all(kwb.kept_original(p) is None for p in (tmp_path / "kernelwright" / "compiled").iterdir())


def test_every_graph_keeps_the_cuda_graphs_option_training_graphs_too(net, monkeypatch):
    """The backend's cuda_graphs option reaches the inference graph and both of AOTAutograd's
    training graphs (each then replays as CUDA graphs where measured faster: emit/graphs.py lends
    the saved tensors and gradients autograd lets go of). The backward graph's replay follows its
    saved tensors where they move (SAVED_PATIENCE) and copies its gradient input from its second
    move; the other graphs keep the default. Both training graphs are verified near real values
    (kwb.NEAR): the backward near its first call's (its saved tensors hold together), the forward
    near the weights and inputs of the call being compiled."""
    import kernelwright

    seen, patience, near, values = [], [], [], []

    def record(model, data, out, **options):
        seen.append(options.get("cuda_graphs"))
        patience.append(model._kw_patience)
        near.append(options.get("near"))
        values.append([t.detach().clone() for t in data if isinstance(t, torch.Tensor)])
        raise RuntimeError("recorded")  # (the graph then runs as captured)

    monkeypatch.setattr(kernelwright, "optimize", record)
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for flag in (True, False):
            torch._dynamo.reset()
            net.eval()
            with torch.no_grad():
                torch.compile(net, backend=kwb.backend(cuda_graphs=flag), dynamic=False)(x)
            torch._dynamo.reset()
            net.train()
            torch.compile(net, backend=kwb.backend(cuda_graphs=flag), dynamic=False)(x).sum().backward()
    assert seen == [True] * 3 + [False] * 3
    backward = patience[2]
    assert patience[:2] == [None, None] and backward[-1] == 1 and set(backward[:-1]) == {kwb.SAVED_PATIENCE}
    assert patience[3:] == patience[:3]
    # the training graphs are verified near real values; the forward's examples are the call's own
    assert near == [None, kwb.NEAR, kwb.NEAR] * 2
    for forward in (values[1], values[4]):
        for want in (x, net.conv.weight, net.fc.bias):
            assert any(t.shape == want.shape and torch.equal(t, want.detach()) for t in forward)


def test_an_inference_graph_under_the_callers_bf16_autocast_runs_generated_code_without_it(net, tmp_path):
    """Inference under the caller's bf16 autocast (a graph Dynamo calls with autocast on): the
    graph is optimised and verified under the bf16 policy, without the caller's autocast (the
    emitted module refuses calls made under one), and called with it off: its generated forward
    ships and matches eager under the autocast; with another precision policy the graph runs as
    captured, saying why in one warning."""
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = net(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.compile(net, backend=kwb.backend(budget_trials=1), dynamic=False)(x)
    said = [str(w.message) for w in caught if "kernelwright" in str(w.message)]
    assert not said, said
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    (result,) = _results(tmp_path)
    assert result["verify"]["passed"] and result["precision"] == "bf16"
    torch._dynamo.reset()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.compile(net, backend=kwb.backend(budget_trials=1, precision="tf32"), dynamic=False)(x)
    said = [str(w.message) for w in caught if "kernelwright" in str(w.message)]
    assert len(said) == 1 and "bfloat16 autocast is not the precision policy (tf32)" in said[0], said
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_cached_results_belong_to_one_version_of_the_source(net, monkeypatch):
    """The backend's cache key holds a digest of kernelwright's own source: what another version
    of the code kept or shipped for a graph is optimised again."""
    gm = torch.fx.symbolic_trace(net)
    x = [torch.randn(2, 3, 8, 8)]
    here = kwb._cache_dir(gm, x, {})
    assert kwb._cache_dir(gm, x, {}) == here and len(kwb.source_digest()) == 16
    monkeypatch.setattr(kwb, "source_digest", lambda: "another version")
    assert kwb._cache_dir(gm, x, {}) != here


class _Swishy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.a(x)
        y = h * torch.sigmoid(h)
        return self.b(y + torch.tanh(y) * 0.5)


def test_the_recompute_partition_saves_fewer_activations_and_both_give_eagers_gradients(tmp_path, monkeypatch):
    """A chain of pointwise ops between two Linears: under "recompute" AOTAutograd's forward graph
    saves fewer of the [4, 32] activations for the backward than under "save" (it recomputes the
    cheap ones there); gradients equal eager's under both."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    saved = {}

    def record(gm, example_inputs, state, options, sizes=None, near=None):
        (out,) = [n for n in gm.graph.nodes if n.op == "output"]
        if "forward" not in saved:  # (the forward graph comes first, then the backward)
            saved["forward"] = sum(1 for a in out.args[0] if isinstance(a, torch.fx.Node) and a.op != "placeholder"
                                   and tuple(a.meta["val"].shape) == (4, 32))
        return gm.forward

    monkeypatch.setattr(kwb, "_optimised", record)
    counts = {}
    for partition in kwb.PARTITIONS:
        torch._dynamo.reset()
        saved.clear()
        torch.manual_seed(0)
        model, ref = _Swishy(), _Swishy()
        ref.load_state_dict(model.state_dict())
        x = torch.randn(4, 8)
        torch.compile(model, backend=kwb.backend(partition=partition))(x).square().sum().backward()
        ref(x).square().sum().backward()
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        counts[partition] = saved["forward"]
    torch._dynamo.reset()
    assert counts["recompute"] < counts["save"], counts


def test_an_unknown_partition_is_refused():
    with pytest.raises(ValueError, match="partition must be one of recompute, save"):
        kwb.backend(partition="none")


class TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.bn(self.c1(x))))


def test_saved_tensors_stay_channels_last_between_the_training_graphs(tmp_path, monkeypatch):
    """Under tf32 the convolutions run channels-last. The forward's saved tensors are free to keep
    that layout (the backend reports their strides to AOTAutograd, which compiles the backward for
    them): the second convolution reads the saved ReLU output itself, no channels-last copy of it,
    and the backward's convolution gradients run channels-last on the saved values as they come.
    The gradients equal eager's; the parameters' gradients keep eager's layout."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, ref = TwoConvs().train(), TwoConvs().train()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(2, 3, 10, 10)
    torch.compile(net, backend=kwb.backend(precision="tf32", budget_trials=1))(x).sum().backward()
    ref(x).sum().backward()
    # the first convolution's bias has a zero gradient in exact arithmetic (the batch norm takes
    # out its mean): float32 rounding noise on the scale of the largest gradient, which any order
    # of summation moves
    atol = 1e-6 * max(p.grad.abs().max().item() for p in ref.parameters())
    for a, b in zip(net.parameters(), ref.parameters()):
        assert a.grad.stride() == b.grad.stride()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=atol)
    results = _results(tmp_path)
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)
    notes = [n for r in results for n in r["rewrites"]]
    assert any(n.startswith("convolution_1") and "run channels-last (relu," in n for n in notes), notes
    grads = [n for n in notes if "convolution gradients run channels-last" in n]
    assert len(grads) == 2
    # each convolution's saved input (the ReLU output; the model's input, saved as the forward's
    # channels-last copy of it) is read by its gradient without a copy
    assert all("_cl" not in n.split("(")[1].split(",")[1] for n in grads), grads
    assert any("returned as its channels-last copy" in n for n in notes), notes
    torch._dynamo.reset()


class ByHandBlock(torch.nn.Module):
    """A pre-norm transformer block whose attention is written by hand (a fused qkv projection,
    matmul, scale, softmax, matmul), as the shipped problem transformer_block."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, dim=-1))
        attn = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


def _by_hand_blocks(tmp_path, monkeypatch):
    """(the attention rewrites each compiled graph gets, a ByHandBlock, its twin with the same
    weights), with the backend's cache under tmp_path and Dynamo reset."""
    from kernelwright.plan import fx_attention

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = []
    rewrite = fx_attention.sdpa_in_fx
    monkeypatch.setattr(fx_attention, "sdpa_in_fx", lambda gm, policy: made.append(rewrite(gm, policy)) or made[-1])
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, ref = ByHandBlock(), ByHandBlock()
    ref.load_state_dict(model.state_dict())
    return made, model, ref


def test_by_hand_attention_trains_as_one_fused_call_and_matches_eager(tmp_path, monkeypatch):
    """Under fp32 the training backend rewrites by-hand attention as scaled_dot_product_attention
    before AOTAutograd (so the backward is the fused kernel's and no scores are saved); q, k and v
    are views of the fused projection with gaps in their strides, which the backward graph is
    optimised for (no call runs a graph as captured); gradients equal eager's."""
    made, model, ref = _by_hand_blocks(tmp_path, monkeypatch)
    x = torch.randn(2, 8, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = torch.compile(model, backend=kwb.backend(precision="fp32", budget_trials=1))(x)
        out.square().mean().backward()
    torch._dynamo.reset()
    assert made == [1]
    assert not [str(w.message) for w in seen if "kernelwright" in str(w.message)]
    want = ref(x)
    want.square().mean().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    results = _results(tmp_path)
    assert len(results) == 2 and all(r["verify"]["passed"] for r in results)


def test_by_hand_attention_with_symbolic_sizes_trains_as_one_fused_call(tmp_path, monkeypatch):
    """With dynamic=True the attention's scale is a number the graph computes from symbolic sizes
    ((d // heads) ** 0.5): the rewrite takes it as SDPA's scale, and both batch sizes train with
    eager's gradients and no graph run as captured."""
    made, model, ref = _by_hand_blocks(tmp_path, monkeypatch)
    compiled = torch.compile(model, backend=kwb.backend(precision="fp32", budget_trials=1), dynamic=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (2, 3):
            x = torch.randn(batch, 8, 16)
            compiled(x).square().mean().backward()
            ref(x).square().mean().backward()
            for (name, a), b in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
                a.grad, b.grad = None, None
    torch._dynamo.reset()
    assert made and set(made) == {1}  # (every graph Dynamo compiled: one attention each)
    assert not [str(w.message) for w in seen if "kernelwright" in str(w.message)]


class Head(torch.nn.Module):
    """A Linear over [batch, tokens, features] ending in dropout with p=0: its result is the copy
    of a view of the GEMM's result."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)

    def forward(self, x):
        return torch.nn.functional.dropout(self.fc(x), 0.0, self.training)


def test_a_training_forward_returns_no_view_the_caller_cannot_change_in_place(tmp_path, monkeypatch):
    """The returned copy stays in a training graph: its results come out of an autograd.Function,
    whose views autograd refuses to change in place (plan.rewrites.returned_copies with views off)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torch._dynamo.reset()
    model, x = Head().train(), torch.randn(2, 3, 8)
    out = torch.compile(model, backend=kwb.backend())(x)
    out.mul_(2)  # (raises for a view a custom Function returned)
    out.sum().backward()
    torch.testing.assert_close(out, model(x) * 2, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    notes = [line for r in _results(tmp_path) for line in r.get("rewrites", [])]
    assert not any("returned copy" in line for line in notes)


class Heads(torch.nn.Module):
    """q, k, v split from one projection into heads, attention, the heads merged, a projection:
    the forward graph saves views of the projection's output for the backward."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = (t.reshape(2, 4, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
        att = torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1) @ v
        return self.proj(att.transpose(1, 2).reshape(2, 4, 16))


def test_training_steps_replay_with_no_copies_once_settled(tmp_path, monkeypatch):
    """Training steps through the backend with both graphs replayed (torch.cuda's graph API
    emulated on the CPU, the replay chosen whatever the timing): once the captures settle, a step
    copies no output out (the saved q, k, v views and the permuted weight gradients are lent:
    autograd lets go of them) and captures nothing again; the backward reads the forward's saved
    tensors where the forward's replay leaves them and copies in only its incoming gradient."""
    import sys

    import kernelwright.pipeline as pipeline
    from fake_graphs import FakeGraphs  # tests/fake_graphs.py

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(pipeline, "graphs_in_every_mode", lambda timings: True)

    FakeGraphs(monkeypatch)  # (a replay runs no kernel here: only the bookkeeping is checked)
    events = []

    def counted(m):  # a shipped kernels/_graphs.py: captures on CPU tensors, its copies counted
        if getattr(m, "_kw_counted", False):
            return
        m._kw_counted = True
        for name in ("_capture", "_copy_out"):
            def wrap(f, name=name):
                def call(*a, **k):
                    events.append(name)
                    return f(*a, **k)
                return call
            monkeypatch.setattr(m, name, wrap(getattr(m, name)))
        FakeGraphs.take_cpu_tensors(monkeypatch, m)

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = Heads(), torch.randn(2, 4, 16)
    step = torch.compile(model, backend=kwb.backend(budget_trials=1), dynamic=False)
    copied_in = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(8):
            for name, m in list(sys.modules.items()):
                if name.endswith("kernels._graphs"):
                    counted(m)
            if i == 5:
                events.clear()
            model.zero_grad(set_to_none=True)
            step(x).square().mean().backward()
    graphs = [g for name, m in sys.modules.items() if name.endswith("kernels._graphs")
              for caps in m._GRAPHS.values() for g in caps.values()]
    torch._dynamo.reset()
    assert len(graphs) == 2 and all(g.replay is not None for g in graphs)  # the forward and the backward
    assert events == [], events  # steps 6-8: replays only
    for g in graphs:
        assert all(c is not None or a for c, a in zip(g.lend, g.alias))  # every output lent (or an input's view)
        copied_in.append([i for i, b in enumerate(g.inputs or []) if b is not None])
    assert sorted(map(len, copied_in)) == [0, 1]  # the backward's incoming gradient alone
