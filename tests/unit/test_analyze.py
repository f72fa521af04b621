"""Analysis: op classes, FLOPs, minimum bytes, roofline and JSON, on small captured problems."""
from __future__ import annotations

import io
import json

import pytest
import torch
import torch.nn as nn
from rich.console import Console

from kernelwright.analyze import (POINTWISE_OPS, analyze, device_spec, load_ceilings, node_cost,
                                  op_class, op_class_of, render_table)
from kernelwright.analyze.cost import distinct_elements
from kernelwright.analyze.device import H200
from kernelwright.capture import TensorMeta, capture
from kernelwright.errors import UserError
from kernelwright.problem import from_module

SPEC = H200


def _analysis(model: nn.Module, *inputs: torch.Tensor, precision: str = "fp32"):
    graph = capture(from_module(model.eval(), list(inputs)))
    return graph, analyze(graph, SPEC, precision)


def _one(a, op: str):
    rows = [r for r in a.nodes if r.op == op]
    assert len(rows) == 1, [r.op for r in a.nodes]
    return rows[0]


class LinearRelu(nn.Module):
    def __init__(self, k=64, n=32):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_linear_relu_classes_flops_bytes():
    g, a = _analysis(LinearRelu(), torch.randn(8, 64))
    mm = _one(a, "addmm")
    assert mm.cls == "gemm"
    assert mm.flops == 2 * 8 * 32 * 64 + 8 * 32
    # bias + x + weight read once, output written once (float32)
    assert mm.bytes == 4 * (32 + 8 * 64 + 32 * 64 + 8 * 32)
    assert mm.intensity == pytest.approx(mm.flops / mm.bytes)
    relu = _one(a, "relu")
    assert relu.cls == "pointwise" and relu.flops == 8 * 32 and relu.bytes == 2 * 4 * 8 * 32
    perm = _one(a, "permute")  # the transposed weight is a view: no bytes
    assert perm.cls == "data_movement" and perm.bytes == 0 and perm.flops == 0 and perm.free
    assert a.totals["flops"] == mm.flops + relu.flops
    assert a.totals["count"] == {"gemm": 1, "pointwise": 1, "data_movement": 1}
    # node_cost agrees with the rows
    node = next(n for n in g.nodes if n.op == "addmm")
    assert node_cost(node, g).flops == mm.flops and op_class(node) == "gemm"


def test_bound_and_precision():
    # 1024^3 GEMM: ~170 FLOP/B, far right of the H200 fp32 ridge (51e12 / 4.21e12 ~ 12)
    _, a = _analysis(nn.Linear(1024, 1024, bias=False), torch.randn(1024, 1024))
    mm = _one(a, "mm")
    assert mm.flops == 2 * 1024**3
    assert mm.bound == "compute"
    assert mm.roofline_us == pytest.approx(2 * 1024**3 / 51e12 * 1e6)
    _, a16 = _analysis(nn.Linear(1024, 1024, bias=False), torch.randn(1024, 1024), precision="bf16")
    mm16 = _one(a16, "mm")  # tensor-core peak: the same GEMM (fp32 in memory) becomes memory-bound
    assert mm16.compute_us == pytest.approx(2 * 1024**3 / 767e12 * 1e6)
    assert mm16.bound == "memory" and mm16.roofline_us == pytest.approx(3 * 4 * 1024**2 / 4210e9 * 1e6)
    _, small = _analysis(nn.ReLU(), torch.randn(64, 64))
    relu = _one(small, "relu")
    assert relu.bound == "memory"
    assert relu.roofline_us == pytest.approx(2 * 4 * 64 * 64 / 4210e9 * 1e6)
    with pytest.raises(UserError):
        analyze(capture(from_module(nn.ReLU(), [torch.randn(2)])), SPEC, "fp8")


def test_conv_flops_plain_grouped_transposed():
    _, a = _analysis(nn.Conv2d(3, 8, 3, padding=1), torch.randn(2, 3, 16, 16))
    c = _one(a, "convolution")
    assert c.cls == "conv"
    out = 2 * 8 * 16 * 16
    assert c.flops == 2 * out * 3 * 9 + out  # + bias
    assert c.bytes == 4 * (2 * 3 * 16 * 16 + 8 * 3 * 9 + 8 + out)

    _, a = _analysis(nn.Conv2d(4, 8, 3, groups=2), torch.randn(1, 4, 10, 10))
    out = 8 * 8 * 8
    assert _one(a, "convolution").flops == 2 * out * (4 // 2) * 9 + out

    _, a = _analysis(nn.ConvTranspose2d(4, 6, 3, stride=2, bias=False), torch.randn(1, 4, 5, 5))
    c = _one(a, "convolution")
    assert c.cls == "conv" and c.shape == (1, 6, 11, 11)
    assert c.flops == 2 * (4 * 5 * 5) * 6 * 9  # w.r.t. the input spatial size

    _, a = _analysis(nn.Conv1d(2, 4, 3), torch.randn(2, 2, 12))
    assert _one(a, "convolution").flops == 2 * (2 * 4 * 10) * 2 * 3 + 2 * 4 * 10


def test_bmm_flops():
    class B(nn.Module):
        def forward(self, x, y):
            return torch.bmm(x, y)

    _, a = _analysis(B(), torch.randn(3, 4, 5), torch.randn(3, 5, 6))
    r = _one(a, "bmm")
    assert r.cls == "gemm" and r.flops == 2 * 3 * 4 * 6 * 5


def test_softmax_layernorm_maxpool_cumsum():
    _, a = _analysis(nn.Softmax(dim=-1), torch.randn(4, 16))
    s = _one(a, "_softmax")
    assert s.cls == "normalization" and s.flops == 5 * 64 and s.bytes == 2 * 4 * 64

    _, a = _analysis(nn.LayerNorm(16), torch.randn(4, 16))
    ln = _one(a, "native_layer_norm")
    assert ln.cls == "normalization"
    # mean/rstd outputs are not consumed: only x, weight, bias read and y written
    assert ln.bytes == 4 * (64 + 16 + 16 + 64)

    _, a = _analysis(nn.MaxPool2d(2), torch.randn(1, 2, 8, 8))
    p = _one(a, "max_pool2d_with_indices")
    assert p.cls == "pooling" and p.flops == (2 * 4 * 4) * 4
    assert p.bytes == 4 * (2 * 8 * 8 + 2 * 4 * 4)  # indices unused: not written

    _, a = _analysis(nn.AvgPool2d(2), torch.randn(1, 2, 8, 8))
    assert _one(a, "avg_pool2d").cls == "pooling"

    class Cum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=1)

    _, a = _analysis(Cum(), torch.randn(4, 16))
    c = _one(a, "cumsum")
    assert c.cls == "scan" and c.flops == 64 and c.bytes == 2 * 4 * 64


def test_reductions_and_broadcast_bytes():
    class R(nn.Module):
        def forward(self, x, b):
            return x.sum(1), x.amax(1), x.var(1), x + b

    _, a = _analysis(R(), torch.randn(8, 16), torch.randn(16))
    s = next(r for r in a.nodes if r.op == "sum")
    assert s.cls == "reduction" and s.flops == 128 and s.bytes == 4 * (128 + 8)
    assert _one(a, "amax").cls == "reduction"
    assert _one(a, "var").cls == "reduction"
    add = _one(a, "add")
    assert add.bytes == 4 * (128 + 16 + 128)  # the bias is read once, not per row
    assert distinct_elements(TensorMeta((8, 16), (0, 1), "float32")) == 16


def test_op_class_table():
    cases = {
        "aten.mm.default": "gemm", "aten.addmm.default": "gemm", "aten.baddbmm.default": "gemm",
        "aten.matmul.default": "gemm", "aten.convolution.default": "conv",
        "aten.gelu.default": "pointwise", "aten.where.self": "pointwise", "aten._to_copy.default": "pointwise",
        "aten.max.other": "pointwise", "aten.max.dim": "reduction", "aten.relu_.default": "pointwise",
        "aten.argmax.default": "reduction", "aten.logsumexp.default": "reduction",
        "aten._native_batch_norm_legit_no_training.default": "normalization",
        "aten.native_group_norm.default": "normalization", "aten._log_softmax.default": "normalization",
        "aten.adaptive_avg_pool2d.default": "pooling", "aten.max_pool3d_with_indices.default": "pooling",
        "aten.logcumsumexp.default": "scan", "aten.cat.default": "data_movement",
        "getitem": "data_movement", "aten.view.default": "data_movement", "aten.t.default": "data_movement",
        "aten.topk.default": "other", "aten.full.default": "other",
    }
    for target, cls in cases.items():
        assert op_class_of(target) == cls, target
    assert {"add", "relu", "exp", "where", "_to_copy", "sigmoid"} <= POINTWISE_OPS
    assert "sum" not in POINTWISE_OPS


def test_copies_move_bytes_views_do_not():
    class C(nn.Module):
        def forward(self, x):
            y = x.transpose(0, 1).contiguous()
            return torch.cat([y, y]), x.view(-1).unsqueeze(0) * 2

    _, a = _analysis(C(), torch.randn(4, 8))
    clone = _one(a, "clone")
    assert clone.cls == "data_movement" and clone.bytes == 2 * 4 * 32 and not clone.free
    assert _one(a, "cat").bytes == 4 * (32 + 64)
    for op in ("permute", "view", "unsqueeze"):
        r = next(r for r in a.nodes if r.op == op)
        assert r.bytes == 0 and r.free


def test_json_shape_and_render():
    _, a = _analysis(LinearRelu(), torch.randn(8, 64))
    data = json.loads(json.dumps(a.to_json()))
    assert data["device"]["name"] == "NVIDIA H200" and data["precision"] == "fp32"
    for n in data["nodes"]:
        assert {"name", "op", "class", "flops", "bytes", "intensity", "roofline_us", "bound", "shape"} <= set(n)
    t = data["totals"]
    assert {"flops", "bytes", "roofline_us", "count", "flops_share", "bytes_share", "fused_roofline_us"} <= set(t)
    assert t["flops_share"]["gemm"] > 0.9
    assert sum(t["bytes_share"].values()) == pytest.approx(1.0)
    # the fused floor reads x, weight, bias once and writes the output once
    assert t["io_bytes"] == 4 * (8 * 64 + 32 * 64 + 32 + 8 * 32)
    buf = io.StringIO()
    Console(file=buf, width=150).print(render_table(a))
    text = buf.getvalue()
    assert "addmm" in text and "total" in text and "NVIDIA H200" in text


def test_device_specs(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELWRIGHT_CEILINGS", raising=False)
    assert device_spec("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"
    assert device_spec("NVIDIA A100-SXM4-40GB").mem_bw_gbs == 1555
    assert device_spec("cpu").name == "generic CPU"
    with pytest.raises(UserError):
        device_spec("Voodoo 2")
    if not torch.cuda.is_available():
        spec = device_spec()
        assert spec.name == "NVIDIA H200" and "no CUDA GPU" in spec.note
        assert (spec.mem_bw_gbs, spec.fp32_tflops, spec.tf32_tflops, spec.bf16_tflops) == (4210, 51, 392, 767)
        assert spec.sms == 132 and spec.l2_bytes == 60 * 2**20
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps({"NVIDIA H200": {"copy_gbs": 4000, "fp32_tflops": 50}}))
    spec = device_spec("h200", ceilings=path)
    assert spec.mem_bw_gbs == 4000 and spec.fp32_tflops == 50 and spec.tf32_tflops == 392
    assert "measured" in spec.source
    assert device_spec("a100", ceilings=path).mem_bw_gbs == 2039  # keyed by another device: unchanged
    path.write_text(json.dumps({"mem_bw_gbs": 3900}))
    monkeypatch.setenv("KERNELWRIGHT_CEILINGS", str(path))
    assert device_spec("h200").mem_bw_gbs == 3900
    assert load_ceilings(path) == {"mem_bw_gbs": 3900}
    with pytest.raises(UserError):
        load_ceilings(tmp_path / "missing.json")


@pytest.mark.xdist_group("small_captures")
def test_anchor_groups_the_shipped_level2_problems_as_their_names_say(small_capture):
    """Benchmarks group level 2 by what anchors each problem (bench.runner.summarise): every
    conv* problem is anchored by a convolution, every gemm_* one by a matrix product."""
    import pathlib

    from kernelwright.analyze.classify import anchor

    root = pathlib.Path(__file__).resolve().parents[2] / "problems" / "level2"
    seen = set()
    for path in sorted(root.glob("*.py")):
        got = anchor(small_capture(path).nodes)
        want = "conv" if path.stem.startswith("conv") else "gemm" if path.stem.startswith("gemm") else None
        assert want is None or got == want, path.stem
        seen.add(got)
    assert seen == {"conv", "gemm"}
    assert anchor(capture(from_module(nn.Sequential(nn.ReLU(), nn.Softmax(-1)), [torch.randn(2, 3)], "pw")).nodes) == "none"


def test_bench_summary_gives_each_anchor_its_geometric_mean():
    from kernelwright.bench.runner import summarise

    def row(level, anchor, compile_ms, kw_ms, correct=True):
        return {"problem": "p", "level": level, "anchor": anchor, "correct": correct,
                "times": {"eager": 4.0, "compile": compile_ms, "kernelwright": kw_ms}}
    rows = [row(2, "conv", 2.0, 1.0), row(2, "conv", 1.0, 2.0), row(2, "gemm", 3.0, 1.0),
            row(2, "gemm", 9.0, 1.0, correct=False), row(3, "gemm", 1.0, 1.0)]
    for r, wall in zip(rows, [30.0, 10.0, 20.0, None, 5.0]):
        r["wall_s"] = wall
    s = summarise(rows, baseline_only=False)
    assert s["level2"]["wall_s_median"] == 20.0 and s["level3"]["wall_s_median"] == 5.0
    by = s["level2"]["kw_over_compile_by_anchor"]
    assert sorted(by) == ["conv", "gemm"] and by["conv"][0] == 2 and by["gemm"][0] == 1  # wrong rows left out
    assert by["conv"][1] == pytest.approx(1.0) and by["gemm"][1] == pytest.approx(3.0)
    assert s["level3"]["kw_over_compile_by_anchor"] == {"gemm": [1, pytest.approx(1.0)]}
