"""The convolution template compiles for sm_90 (no GPU needed) with the first configs of its space:
dense, grouped, depthwise and transposed convolutions with 1-3 spatial dims, float32 (IEEE and
TF32), bf16 casts and bf16 tensors, NCHW and channels-last, with and without a fused epilogue, at
real problem sizes; box configs (tensor-descriptor loads) where the space offers them, transposed
convolutions' included, and padded-grid (FLAT) configs. The interpreter tests never lower a kernel; this catches what only the
compiler sees, and checks that each build's shared memory fits the H200's per-block budget (the
space's shared-memory model). The compiling runs in one fresh worker process
(tests/kernels/conv_target_compile_worker.py): the interpreter tests put Triton into interpreter
mode for this whole process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelwright.analyze.device import H200

sys.path.insert(0, str(Path(__file__).parent))
from conv_target_compile_worker import CASES  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv_sm90") / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    worker = Path(__file__).with_name("conv_target_compile_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(out)], env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_conv_configs_compile_for_sm90(results, case):
    rows = results[case]
    assert rows
    failures = [f"{r['config']} {r['kernel']}: {r['error']}" for r in rows if r["error"]]
    assert not failures, "\n".join(failures)
    for r in rows:
        assert r["shared"] is not None and r["shared"] <= H200.smem_per_block, r


def test_the_two_row_cases_compile_two_row_boxes(results):
    for case in ("conv2d-two-rows-tf32-epi", "conv2d-two-rows-maxpool2-bf16"):
        convs = [r for r in results[case] if r["kernel"] != "_pad_copy_kernel"]  # (an NCHW input's copy)
        assert [r["config"].get("TWO_ROWS") for r in convs] == [1]
    # the NCHW input is copied channels-last by the tiled copy kernel, compiled beside the convolution
    assert [r["kernel"] for r in results["conv2d-two-rows-maxpool2-bf16"]].count("_pad_copy_kernel") == 1


def test_the_warp_specialised_box_loop_compiles_into_producer_and_consumer_warps(results):
    (row,) = results["conv2d-warp-spec-tf32-epi"]
    assert row["config"]["WARP_SPEC"] == 1 and row["config"].get("BOX_W") and row["warp_specialized"] is True
    # the space's own configs stay unspecialised
    assert all(r["warp_specialized"] is False for r in results["conv2d-two-rows-tf32-epi"])


def test_the_flat_cases_compile_padded_grid_configs(results):
    for case in ("conv2d-flat-bf16-cast-epi", "conv3d-flat-tf32-pad", "conv2d-flat-stats-bf16-tensors"):
        assert results[case][0]["config"].get("FLAT") is True, results[case]
