"""End to end on the CPU for single decisions around convolutions: optimize a shipped problem (or a
small module) at its SMALL size in the Triton interpreter and check what ships (absorbed casts,
running statistics, the generated convolution with --no-library, box configs, prologues and
epilogues, pool chains, layouts) and that the emitted ModelNew matches Model. The sweep over every
GEMM / convolution problem is tests/e2e/test_optimize_gemm_conv.py."""

from __future__ import annotations

import re

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from kernelwright.emit.module import import_model_new, model_new_like
from kernelwright.pipeline import Options, optimize_problem
from kernelwright.problem import from_module, load_problem

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2] / "problems"


def test_bf16_depthwise_conv_absorbs_its_input_cast(tmp_path):
    """Under bf16 the depthwise kernel reads the float32 input and rounds it as it loads: the cast
    group is not run (reported as absorbed), the forward passes x itself to the conv kernel."""
    result = optimize_problem(load_problem(ROOT / "level1/depthwise_conv2d.py", small=True), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, small=True, precision="bf16",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    groups = {g["id"]: g for g in result["groups"]}
    absorbed = [g for g in groups.values() if g["strategy"] == "absorbed"]
    assert len(absorbed) == 1 and absorbed[0]["ops"] == ["_to_copy"], groups
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert f"_k_{absorbed[0]['id']}." not in text
    assert re.search(r"= _k_convolution_bf16\.launch\(x, ", text), text


@pytest.mark.parametrize("name", ["level2/conv2d_batch_norm_train_relu.py", "level3/resnet_basic_block.py"])
def test_training_batch_norm_updates_running_stats(name, tmp_path):
    """ModelNew updates the buffers Model's forward mutates (running mean / var, batch count;
    buffers of one dtype are written by one `_foreach_copy_`, which takes its one-launch path only
    when its tensors share a dtype), with the same values."""
    import torch

    from kernelwright.emit.module import import_model_new

    problem = load_problem(ROOT / name, small=True)
    optimize_problem(problem, tmp_path / "out", Options(device="cpu", budget_trials=1, small=True,
                                                        db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    text = (tmp_path / "out" / "model_new.py").read_text()
    assert "_foreach_copy_" in text and text.count("_foreach_copy_(") <= 2  # float32 stats, int64 counts
    ref = problem.make_model()
    new = import_model_new(tmp_path / "out" / "model_new.py").ModelNew(*problem.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    for seed in (1, 2):
        x = problem.make_inputs(seed)
        with torch.no_grad():
            ref(*x), new(*x)
    bufs = dict(ref.named_buffers())
    assert any("running_mean" in k for k in bufs)
    for k, v in new.named_buffers():
        torch.testing.assert_close(v, bufs[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("name,policy,kind", [("level2/conv2d_relu_bias_add.py", "fp32", "conv_epilogue"),
                                              # (fp32: two library variants beside it, the generated one first)
                                              ("level2/conv_transpose2d_add_gelu.py", "fp32", "conv_epilogue"),
                                              ("level2/conv2d_group_norm_tanh.py", "bf16", "node"),
                                              ("level2/conv3d_softmax_max_pool_max_pool.py", "tf32", "conv_pool"),
                                              # the pool chain (its pre and post groups) taken over by the pair
                                              ("level2/conv2d_subtract_hardswish_max_pool_mish.py", "fp32",
                                               "conv_pool")])
def test_no_library_ships_the_generated_convolution(name, policy, kind, tmp_path):
    """With no_library every convolution runs the implicit-GEMM template (with its pointwise
    epilogue fused where one follows; alone, its bias fused, before a reduction; with a channel
    softmax and two max pools fused, writing only the pooled result), verified in the interpreter,
    and the emitted ModelNew matches Model."""
    result = optimize_problem(load_problem(ROOT / name, small=True), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, small=True, precision=policy, no_library=True,
                                      mode="eval", db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    rows = [g for g in result["groups"] if "convolution" in g["ops"] and g["kind"] == kind]
    assert rows and all(g["strategy"] == "triton" for g in rows), result["groups"]
    nodes = [g for g in result["groups"] if g["ops"] == ["convolution"] and g["kind"] == "node"]
    assert all(g["strategy"] == "triton" for g in nodes), nodes  # (not a library variant of it)
    kernels = list((tmp_path / "out" / "kernels").glob("*.py"))
    assert any("implicit" in k.read_text() and "_conv_launch" in k.read_text() for k in kernels)
    assert not any(k.stem.endswith("_chain") for k in kernels)  # a pair computing a whole chain replaces it
    assert "Library units: " in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("policy,pooled", [("bf16", False), ("tf32", True)])
def test_a_stride_1_convolution_with_16_channels_ships_a_box_config(policy, pooled, tmp_path, monkeypatch):
    """Where the descriptor path applies (stride 1, one group, >= 16 channels, tf32 / bf16; a fused
    pool's window of a power-of-two size), the space's first config is a box one (no padded-grid
    configs: the search's spaces leave them out): with no_library and no prior trials (the untimed
    choice is then the space's first config) the emitted fused kernel reads the input through
    tensor descriptors (in the interpreter) and ModelNew matches Model."""
    from kernelwright.search import plan_search

    monkeypatch.setattr(plan_search, "packaged_priors", lambda: [])

    class ConvAct(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            y = torch.nn.functional.silu(self.conv(x)) * 0.5
            return torch.tanh(torch.nn.functional.max_pool2d(y, 2)) if pooled else y

    out = tmp_path / "out"
    result = optimize_problem(from_module(ConvAct().eval(), [torch.randn(2, 16, 8, 10)]), out,
                              Options(device="cpu", budget_trials=1, precision=policy, no_library=True, mode="eval",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    (pair,) = [g for g in result["groups"] if g["kind"] == ("conv_pool" if pooled else "conv_epilogue")]
    assert pair["strategy"] == "triton" and pair["config"].get("BOX_W", 0) > 0, pair
    assert not pair["config"].get("FLAT"), pair
    text = next(k.read_text() for k in (out / "kernels").glob("*_conv.py"))
    assert f"BOX_W={pair['config']['BOX_W']}" in text and "TensorDescriptor" in text


@pytest.mark.parametrize("policy", ["tf32"])  # (every policy's prologue: tests/kernels/test_conv_epilogue.py)
def test_a_dense_layer_computes_its_batch_norm_and_relu_as_the_convolutions_prologue(policy, tmp_path):
    """A DenseNet layer in eval mode (batch norm, ReLU, 3x3 convolution, concatenation): with
    no_library the convolution's kernel absorbs the norm and activation group (and the layout copy
    after it) and applies it to the values it loads; the group's kernel is not emitted and ModelNew
    matches Model."""

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.conv = nn.BatchNorm2d(16), nn.Conv2d(16, 8, 3, padding=1, bias=False)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.bias.data.uniform_(0.2, 1)

        def forward(self, x):
            return torch.cat([x, self.conv(torch.relu(self.bn(x)))], 1)

    out = tmp_path / "out"
    result = optimize_problem(from_module(Dense().eval(), [torch.randn(2, 16, 8, 10)]), out,
                              Options(device="cpu", budget_trials=1, precision=policy, no_library=True, mode="eval",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    rows = {g["id"]: g for g in result["groups"]}
    (norm,) = [g for g in rows.values() if g["kind"] == "pointwise" and "relu" in g["ops"]]
    assert norm["strategy"] == "absorbed", norm
    (conv,) = [g for g in rows.values() if "convolution" in g["ops"] and g["strategy"] == "triton"]
    assert "relu" in conv["ops"], conv
    texts = [k.read_text() for k in (out / "kernels").glob("*.py") if not k.stem.startswith("_")]
    assert any("_prologue(a, " in t for t in texts)
    assert not any(norm["id"] in k.stem for k in (out / "kernels").glob("*.py"))
    header = (out / "model_new.py").read_text().split("import", 1)[0]
    assert f"{norm['id']} [pointwise]" in header and "absorbed (computed inside" in header


def test_a_training_batch_norm_before_a_convolution_is_split_and_applied_in_its_loads(tmp_path, monkeypatch):
    """A ResNet basic block in training mode: the first batch norm splits into its statistics (and
    running statistics) and a pointwise apply that the second convolution computes as it loads its
    input (the split made at this small size too); ModelNew matches Model in training mode, buffer
    updates included."""
    from kernelwright.plan import norm_split

    monkeypatch.setattr(norm_split, "CONV_SPLIT_MIN_ROW", 0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)

        def forward(self, x):
            return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)

    out = tmp_path / "out"
    result = optimize_problem(from_module(Block().train(), [torch.randn(2, 16, 8, 10)]), out,
                              Options(device="cpu", budget_trials=1, precision="tf32", no_library=True, mode="train",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    rows = result["modes"]["train"]["groups"] if "modes" in result else result["groups"]
    (apply,) = [g for g in rows if g["kind"] == "pointwise" and "sub" in g["ops"] and "relu" in g["ops"]]
    assert apply["strategy"] == "absorbed", apply
    texts = [k.read_text() for k in (out / "kernels").glob("*.py") if not k.stem.startswith("_")]
    assert any("_prologue(a, " in t for t in texts)


def test_a_group_between_two_convolutions_is_the_first_ones_epilogue_not_the_seconds_prologue(tmp_path):
    """conv -> batch norm + ReLU -> conv: the group could be the first convolution's epilogue or the
    second's prologue, not both (each kernel would read a value the other no longer writes); it
    stays the first's epilogue, and ModelNew matches Model."""

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1, self.c2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Conv2d(16, 8, 3)
            self.b1.running_mean.uniform_(-1, 1)

        def forward(self, x):
            return torch.tanh(self.c2(torch.relu(self.b1(self.c1(x)))))

    out = tmp_path / "out"
    result = optimize_problem(from_module(Two().eval(), [torch.randn(2, 16, 7, 9)]), out,
                              Options(device="cpu", budget_trials=1, precision="tf32", no_library=True, mode="eval",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    pairs = [g for g in result["groups"] if g["kind"] == "conv_epilogue" and g["strategy"] == "triton"]
    assert len(pairs) == 2 and any("relu" in g["ops"] and "_native_batch_norm_legit_no_training" in g["ops"]
                                   for g in pairs), result["groups"]
    texts = [k.read_text() for k in (out / "kernels").glob("*.py") if not k.stem.startswith("_")]
    assert not any("_prologue(a, " in t for t in texts)


def test_two_convolutions_read_by_one_group_fuse_one_of_them(tmp_path):
    """A residual add of two convolutions makes two pairs around one group: once the first fuses
    the group, the second (whose fused kernel would read the first's never-written result) is not
    searched, and the emitted module runs the generated forward."""

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)

        def forward(self, x):
            return torch.relu(self.a(x) + self.b(x))

    out = tmp_path / "out"
    result = optimize_problem(from_module(Two(), [torch.randn(2, 3, 8, 8)]), out,
                              Options(device="cpu", budget_trials=1, precision="fp32", no_library=True, mode="eval",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"]
    pairs = [g for g in result["groups"] if g["kind"] == "conv_epilogue"]
    assert len(pairs) == 1 and pairs[0]["strategy"] == "triton", result["groups"]
    assert "original forward kept" not in (out / "model_new.py").read_text()


def test_a_pool_chain_ships_after_a_transposed_convolution(tmp_path):
    """A transposed convolution's pool is not fused into the convolution template, so the pool
    chain (the scaling before the average pool, the bias and scaling after it) ships as one pool
    kernel reading the convolution's output, and the emitted module matches Model (at another
    batch size too)."""

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1)
            self.bias = nn.Parameter(torch.randn(4, 1, 1, 1))

        def forward(self, x):
            return (torch.nn.functional.avg_pool3d(self.conv(x) * 0.5, 2) + self.bias) * 2.0

    out = tmp_path / "out"
    problem = from_module(Chain(), [torch.randn(2, 3, 3, 4, 4)])
    result = optimize_problem(problem, out,
                              Options(device="cpu", budget_trials=1, precision="fp32", no_library=True,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    (row,) = [g for g in result["groups"] if g["kind"] == "pool_chain"]
    assert row["strategy"] == "triton" and "avg_pool3d" in row["ops"], row
    (kernel,) = [k for k in (out / "kernels").glob("*_chain.py")]
    assert "Fused: group" in kernel.read_text()
    reference = problem.make_model()
    new = model_new_like(import_model_new(out / "model_new.py"), problem, reference, "cpu")
    x = torch.randn(3, 3, 3, 4, 4)  # another batch size
    with torch.no_grad():
        torch.testing.assert_close(new(x), reference(x), rtol=1e-5, atol=1e-5)
        x = problem.make_inputs(1)[0]
        torch.testing.assert_close(new(x), reference(x), rtol=1e-5, atol=1e-5)


def test_a_group_norm_before_a_pool_ships_as_statistics_and_a_pool_chain(tmp_path):
    """Convolution + bias + group norm + scaling + max pool: the norm's statistics are one kernel
    reading the convolution's output (the bias added as it reads), and the apply runs as the pool
    chain's prologue on each window element, so the normalized tensor is never written."""

    class GroupNormPool(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
            self.bias = nn.Parameter(torch.randn(6, 1, 1))
            self.gn = nn.GroupNorm(2, 6)
            self.scale = nn.Parameter(torch.randn(6, 1, 1))

        def forward(self, x):
            return torch.nn.functional.max_pool2d(self.gn(self.conv(x) + self.bias) * self.scale, 2)

    out = tmp_path / "out"
    problem = from_module(GroupNormPool(), [torch.randn(2, 3, 6, 8)])
    result = optimize_problem(problem, out,
                              Options(device="cpu", budget_trials=1, precision="fp32", no_library=True,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    assert any("group norm of" in r for r in result["rewrites"])
    (row,) = [g for g in result["groups"] if g["kind"] == "pool_chain"]
    assert row["strategy"] == "triton" and "max_pool2d_with_indices" in row["ops"], row
    body = (out / "model_new.py").read_text().split("def _kw_forward", 1)[1]
    assert "_chain.launch(convolution, " in body  # the chain reads the convolution's output itself
    reference = problem.make_model()
    new = model_new_like(import_model_new(out / "model_new.py"), problem, reference, "cpu")
    x = problem.make_inputs(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(new(x), reference(x), rtol=1e-5, atol=1e-5)


def test_two_pool_chains_sharing_a_group_ship_one(tmp_path):
    """pool -> pointwise -> pool gives two chains around one group (the first's epilogue, the
    second's prologue); once one kernel computes the group the other chain is not searched, and
    the emitted module verifies."""

    class TwoPools(nn.Module):
        def forward(self, x):
            y = torch.nn.functional.max_pool2d(x, 2)
            return torch.nn.functional.avg_pool2d(torch.tanh(y) * 2.0, 2)

    result = optimize_problem(from_module(TwoPools(), [torch.randn(2, 3, 8, 8)]), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, precision="fp32", no_library=True,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"], result["verify"]
    chains = [g for g in result["groups"] if g["kind"] == "pool_chain"]
    assert len(chains) == 1 and chains[0]["strategy"] == "triton", result["groups"]
    assert len(list((tmp_path / "out" / "kernels").glob("*_chain.py"))) == 1


def test_a_convolution_kept_nchw_after_a_channels_last_one_is_viewed_through_a_copy(tmp_path):
    """Under tf32 the first convolution runs channels-last; the second, whose result is flattened
    (a view channels-last strides cannot express), is kept NCHW, but the library convolves its
    channels-last input into a channels-last result: the flatten reads an explicit contiguous copy,
    not a view of a layout the library did not give."""

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.fc = nn.Linear(64, 4)

        def forward(self, x):
            return self.fc(self.c2(torch.nn.functional.leaky_relu(self.c1(x), 0.2)).flatten(1))

    problem = from_module(Encoder(), [torch.randn(2, 3, 8, 8)])
    result = optimize_problem(problem, tmp_path / "out",
                              Options(device="cpu", budget_trials=1, precision="tf32",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert any("kept NCHW" in r for r in result["rewrites"]) and result["capture"] == "ok"
    assert result["verify"]["passed"], result["verify"]


def test_a_pool_chain_leaves_a_cast_that_the_next_convolution_computes(tmp_path):
    """Under bf16 the next convolution's kernel computes the bf16 cast of the pooled value itself;
    a pool chain must not take that cast as its epilogue (the convolution reads the pooled value,
    which the chain would no longer write)."""

    class Audio(nn.Module):  # (the M5 audio network's first stages)
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv1d(1, 8, 16, stride=4), nn.Conv1d(8, 8, 3)
            self.b1, self.b2 = nn.BatchNorm1d(8), nn.BatchNorm1d(8)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            x = torch.nn.functional.max_pool1d(torch.relu(self.b1(self.c1(x))), 4)
            x = torch.nn.functional.max_pool1d(torch.relu(self.b2(self.c2(x))), 2)
            return self.fc(torch.nn.functional.avg_pool1d(x, x.shape[-1]).permute(0, 2, 1))

    problem = from_module(Audio(), [torch.randn(2, 1, 400)])
    result = optimize_problem(problem, tmp_path / "out",
                              Options(device="cpu", budget_trials=1, precision="bf16", no_library=True,
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert not [m for m, r in result["modes"].items() if "verify_fallback" in r], result["modes"]  # both ship
    assert any(g["kind"] == "pool_chain" and g["strategy"] == "triton" for r in result["modes"].values()
               for g in r["groups"])
