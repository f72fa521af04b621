"""ModelNew as emit/module.py writes it for a shipped problem, imported and run against Model: a fused
GEMM + epilogue kernel (Triton interpreter) in place of both units, the original forward under the
precision policy when no generated program is kept, and parameters read from the modules' own tables."""
import os

import pytest
import torch
import torch.nn as nn

from kernelwright.capture import capture
from kernelwright.codegen import gemm_epilogue
from kernelwright.emit.module import import_model_new, ModeForward, render_model_new, write_module
from kernelwright.plan import plan_graph
from kernelwright.problem import load_problem

pytestmark = pytest.mark.interpreter
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gemm_epilogue_fusion_emits_a_working_module(tmp_path):
    """Strategy 2: addmm + gelu*scale as one Triton GEMM, emitted into ModelNew in place of both units."""
    torch.manual_seed(0)
    p = load_problem(os.path.join(ROOT, "problems/level2/gemm_gelu_scale.py"), small=True)
    g = capture(p)
    plan = plan_graph(g)
    gemm = next(g.node(u.node) for u in plan.units if u.node and g.node(u.node).target in gemm_epilogue.GEMMS)
    group = next(grp for grp in plan.groups if gemm.name in grp.inputs)
    assert gemm_epilogue.fusable(g, gemm, group) is None
    fused = gemm_epilogue.build(g, gemm, group)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "num_warps": 4, "num_stages": 1}
    text, ins = gemm_epilogue.render(fused, cfg, "fp32")
    kernels = {group.id: ("g_gemm", ins, list(group.outputs), False), gemm.name: None}
    path = write_module(tmp_path, render_model_new(p, [ModeForward("any", plan, kernels, {"g_gemm": text}, [])], "fp32", None), {"g_gemm": text})
    body = path.read_text().split("def _kw_forward_any", 1)[1]
    assert "_k_g_gemm.launch(" in body and "addmm" not in body
    mod = import_model_new(path)
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(7)
    torch.testing.assert_close(new(*x), ref(*x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_original_forward_fallback_keeps_the_policy(tmp_path, policy, dtype):
    """When the generated program loses (or capture fails), ModelNew runs the original forward;
    under bf16 it does so in bf16 autocast, as the eager baseline it is compared with (without it
    the fallback ran float32 GEMMs and was timed 10x slower than eager on the H200)."""
    p = load_problem(os.path.join(ROOT, "problems", "level2", "gemm_bias_relu.py"), small=True)
    path = write_module(tmp_path, render_model_new(p, [], policy, None), {})
    mod = import_model_new(path)
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(1)
    out = new(*x)
    assert out.dtype == dtype
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=policy == "bf16"):
        want = ref(*x)
    torch.testing.assert_close(out, want)


def test_forward_reads_weights_from_the_module_tables_or_through_attributes(tmp_path):
    """The forward (and the CUDA-graph state stamp) reads parameters and buffers from the modules'
    own tables, not through nn.Module attribute access (microseconds of host time each); a module
    whose weight is an attribute computed on the fly (no table entry) is read through attributes;
    running statistics are updated in the tensors the forward read."""
    p = load_problem(os.path.join(ROOT, "problems", "level3", "resnet_basic_block.py"), small=True)
    plan = plan_graph(capture(p))
    text = render_model_new(p, [ModeForward("any", plan, {}, {}, [])], "fp32", None)
    body = text.split("def _kw_compute_any", 1)[1]  # (it updates running statistics: compute and commit)
    assert "self.conv1.weight" not in body and "= _kw_tensors(self)" in body
    assert "self._modules['bn1']._buffers['running_mean']" in text
    mod = import_model_new(write_module(tmp_path, text, {}))
    ref = p.make_model()
    new = mod.ModelNew(*p.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = p.make_inputs(1)
    with torch.no_grad():  # (with gradients on, the module runs the original forward)
        torch.testing.assert_close(new(*x), ref(*x))
    torch.testing.assert_close(new.bn2.running_var, ref.bn2.running_var)
    assert int(new.bn1.num_batches_tracked) == 1

    class Doubled(nn.Module):  # conv2's weight as a property: no entry in _parameters
        def __init__(self, conv):
            super().__init__()
            self.w_half = nn.Parameter(conv.weight.detach() / 2)

        @property
        def weight(self):
            return self.w_half * 2

    from kernelwright.emit.graphs import stamp as identity

    stamp = identity(*mod._kw_tensors(new))
    new.conv2 = Doubled(new.conv2)
    assert identity(*mod._kw_tensors(new)) != stamp
    with torch.no_grad():
        torch.testing.assert_close(new(*x), ref(*x))
