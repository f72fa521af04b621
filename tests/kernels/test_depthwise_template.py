"""The depthwise conv node template: chosen for depthwise convs only, and equal to cuDNN's result."""
from __future__ import annotations


import pytest
import torch
from torch import nn

from kernelwright.build.pyload import load_module_from_source
from kernelwright.capture import capture
from kernelwright.codegen.node_kernels import template_for, used_outputs
from kernelwright.problem import from_module

pytestmark = pytest.mark.interpreter


def _conv_node(conv, x):
    graph = capture(from_module(conv, [x]))
    return graph, next(n for n in graph.nodes if n.target == "aten.convolution.default")


@pytest.mark.parametrize("mult,stride,dilation,bias", [(1, 1, 1, True), (2, 2, 1, False), (1, 1, 2, True)])
def test_depthwise_template_matches_cudnn(mult, stride, dilation, bias, tmp_path):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4 * mult, 3, stride=stride, padding=1, dilation=dilation, groups=4, bias=bias)
    x = torch.randn(2, 4, 9, 7)
    graph, node = _conv_node(conv, x)
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.depthwise", why
    configs = template.space(graph, node)
    assert configs and len(set(configs)) == len(configs)
    for cfg in (template.default(graph, node), configs[-1]):
        k = template.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
        mod = load_module_from_source(k.source, f"dw_{mult}_{stride}_{dilation}", tmp_path)
        args = [x, conv.weight.detach()] + ([conv.bias.detach()] if bias else [])
        assert len(k.inputs) == len(args)
        (y,) = mod.launch(*args)
        torch.testing.assert_close(y, conv(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kh,kw,stride,rows", [(5, 5, 1, True), (2, 3, 1, True), (3, 1, 1, True), (7, 7, 1, True),
                                              (1, 3, 1, False), (9, 3, 1, False), (3, 9, 1, False), (5, 5, 2, False)])
def test_row_streaming_kernel_is_searched_for_kernels_up_to_7x7_at_row_stride_1(kh, kw, stride, rows, tmp_path):
    """The space has row-streaming configs (ROWS > 0) exactly where they apply; the first is a seed
    (timed before the cost model ranks the rest); its module matches cuDNN, and a conv it does not
    apply to renders no row-streaming kernel at all."""
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 4, (kh, kw), stride=stride, padding=(kh // 2, kw // 2), groups=4)
    x = torch.randn(2, 4, 12, 10)
    graph, node = _conv_node(conv, x)
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.depthwise", why
    streaming = [c for c in template.space(graph, node) if c.as_dict().get("ROWS")]
    assert bool(streaming) == rows
    seeds = template.seeds(graph, node)
    assert seeds[0] == template.default(graph, node) and seeds[1:] == streaming[:1]
    for cfg in seeds:
        k = template.render(graph, node, cfg.as_dict(), used_outputs(graph, node))
        assert ("_rows_kernel" in k.source) == rows
        (y,) = load_module_from_source(k.source, f"dw_rows_{kh}_{kw}_{stride}", tmp_path).launch(
            x, conv.weight.detach(), conv.bias.detach())
        torch.testing.assert_close(y, conv(x).detach(), rtol=1e-5, atol=1e-5)


def test_a_dense_conv_is_not_depthwise():
    graph, node = _conv_node(nn.Conv2d(4, 8, 3), torch.randn(1, 4, 6, 6))
    template, _ = template_for(graph, node)
    assert template is None or template.name != "triton.depthwise"


def test_bf16_policy_runs_depthwise_convs_on_bf16_operands_like_autocast(tmp_path):
    """Under bf16 the depthwise conv reads bf16 copies of x, w and b (as autocast runs it) and the
    template writes a bf16 result rounded to nearest even: the double-precision result of the same
    bf16 operands rounded once, but for the rare sums on a rounding boundary (the interpreter's own
    cast truncates: about half would differ)."""
    from kernelwright.plan.rewrites import rewrite

    torch.manual_seed(1)
    conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)
    x = torch.randn(2, 4, 9, 7)
    graph, notes = rewrite(capture(from_module(conv, [x])), "bf16")
    assert any("bf16 operands" in n for n in notes), notes
    node = next(n for n in graph.nodes if n.target == "aten.convolution.default")
    assert node.meta.dtype == "bfloat16"
    assert all(graph.meta(a.name).dtype == "bfloat16" for a in node.args[:3])
    template, why = template_for(graph, node)
    assert template is not None and template.name == "triton.depthwise", why
    k = template.render(graph, node, template.default(graph, node).as_dict(), used_outputs(graph, node))
    # the input's cast is absorbed: the kernel reads float32 x (the graph input) and rounds it as it loads
    cast = graph.node(node.args[0].name)
    assert template.absorbed(graph, node)[0] == [cast.name, node.name]
    assert k.inputs[0] == cast.args[0].name and graph.is_input(k.inputs[0])
    mod = load_module_from_source(k.source, "dw_bf16", tmp_path)
    xb, wb, bb = (t.detach().bfloat16() for t in (x, conv.weight, conv.bias))
    (y,) = mod.launch(x, wb, bb)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, mod.launch(xb, wb, bb)[0])  # rounding in the kernel == casting first
    ref = nn.functional.conv2d(xb.double(), wb.double(), bb.double(), padding=1, groups=4).float().bfloat16()
    assert (y.float() - ref.float()).abs().max().item() <= 2 ** -7 * ref.float().abs().max().item()
    # the float32 sum (any order) is within a few float32 ulps of the double one: at most one bf16
    # step apart where it sits on a rounding boundary, never a truncation's systematic bias
    assert (y.float() - ref.float()).ne(0).float().mean().item() < 0.02


def test_only_a_model_inputs_cast_is_absorbed_and_the_program_verifies(tmp_path):
    """Two depthwise convs with a ReLU6 between them under bf16: the first absorbs the cast of the
    model input; the second's input cast is fused into the ReLU6 group, which never writes its
    float32 value, so absorbing it would read a value nobody computes (found by a sweep program:
    NameError in the generated forward)."""
    from kernelwright.pipeline import Options, optimize_problem
    from kernelwright.plan.rewrites import rewrite

    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU6(),
                          nn.Conv2d(4, 4, 3, padding=1, groups=4))
    x = torch.randn(2, 4, 8, 8)
    graph, _ = rewrite(capture(from_module(model, [x])), "bf16")
    first, second = [n for n in graph.nodes if n.target == "aten.convolution.default"]
    template, _ = template_for(graph, first)
    assert template.absorbed(graph, first) is not None
    assert template.absorbed(graph, second) is None
    result = optimize_problem(from_module(model, [x]), tmp_path / "out",
                              Options(device="cpu", budget_trials=1, precision="bf16",
                                      db_path=str(tmp_path / "db.jsonl"), log=lambda s: None))
    assert result["verify"]["passed"] and "verify_fallback" not in result, result["verify"]
    assert sum(g["strategy"] == "absorbed" for g in result["groups"]) == 1


# compiled in a fresh process, out of the interpreter mode the other tests put Triton in
SM90_WORKER = r'''
import json, sys, tempfile
import torch
from kernelwright.build.triton_target import compile_source_for_target, meta_tensor
from kernelwright.codegen.epilogue import Epilogue, EpilogueOperand
from kernelwright.codegen.helpers import with_helpers
from kernelwright.codegen.triton_gemm import render_depthwise

epi = Epilogue((EpilogueOperand("e0", "col"), EpilogueOperand("e1", "full")), "acc = kw_tanh(acc + e0) + e1")
pro = Epilogue((EpilogueOperand("p0", "col"), EpilogueOperand("p1", "col")), "acc = tl.minimum(tl.maximum(acc * p0 + p1, 0.0), 6.0)")
N, C, H, W = 32, 384, 56, 56
cases = {  # name: (launch keywords, statistics, operand dtype, channels-last input, input prologue)
    "tiles-nchw-fp32": ("stride=1, padding=1, BLOCK_M=256, BLOCK_N=4, num_warps=4", False, torch.float32, False, False),
    "rows-stats-bf16-cast-no-y": ("stride=1, padding=1, BLOCK_M=64, BLOCK_N=4, ROWS=8, num_warps=2, ROUND_X=True, "
                                  "out_dtype=torch.bfloat16, write_y=False", True, torch.float32, True, False),
    "tiles-stats-bf16-cl-out": ("stride=2, padding=1, BLOCK_M=64, BLOCK_N=32, num_warps=4, out_channels_last=True",
                                True, torch.bfloat16, True, False),
    "tiles-prologue-stats-cl": ("stride=2, padding=1, BLOCK_M=64, BLOCK_N=32, num_warps=4, out_channels_last=True",
                                True, torch.float32, True, True),
}
rows = {}
for name, (kw, stats, dtype, cl, prologue) in cases.items():
    text = with_helpers(render_depthwise(epi, name="dw", rows_kernel=(3, 3), stats=stats,
                                         prologue=pro if prologue else Epilogue()))
    call = "*args[:-2], prologue_operands=args[-2:]" if prologue else "*args"
    text += f"\n_launch = launch\n\n\ndef launch(*args):\n    return _launch({call}, {kw})\n"
    oh = H // (2 if "stride=2" in kw else 1)
    x = meta_tensor((N, C, H, W), (C * H * W, 1, W * C, C) if cl else (C * H * W, H * W, W, 1), dtype)
    args = [x, meta_tensor((C, 1, 3, 3), (9, 9, 3, 1), dtype), meta_tensor((C,), (1,), torch.float32),
            meta_tensor((N, C, oh, oh), (C * oh * oh, oh * oh, oh, 1), torch.float32)]
    args += [meta_tensor((C,), (1,), torch.float32)] * (2 if prologue else 0)
    with tempfile.TemporaryDirectory() as d:
        rows[name] = [[b.kernel, b.error] for b in compile_source_for_target(text, name.replace("-", "_"), args, d)]
json.dump(rows, open(sys.argv[1], "w"))
'''


def test_the_direct_kernel_with_an_epilogue_and_statistics_compiles_for_sm90(tmp_path):
    """The interpreter tests never lower a kernel: the pixel-tile and row-streaming kernels with an
    epilogue, their partial statistics (with and without y's store), a channels-last bf16 store and
    an input prologue compile for sm_90 (no GPU needed)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SM90_WORKER, str(out)], env=env, cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert rows["tiles-nchw-fp32"] == [["dw_kernel", None]]
    assert rows["rows-stats-bf16-cast-no-y"] == [["dw_rows_kernel", None]]
    assert rows["tiles-stats-bf16-cl-out"] == [["dw_kernel", None]]
    assert rows["tiles-prologue-stats-cl"] == [["dw_kernel", None]]
