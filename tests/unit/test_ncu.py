"""measure/ncu.py: ncu's raw CSV page read into launches, kernels mapped to result.json's units,
counters per call, and the one-line reasons when there are none."""
import json

import pytest

from kernelwright.measure import ncu

# the shape of `ncu --clock-control none --csv --page raw --print-units base --metrics ...` on stdout:
# ncu's own lines, a header row, a units row, one row per profiled launch (3 calls of a forward)
SAMPLE = """==PROF== Connected to process 41877 (/usr/bin/python3.12)
==PROF== Profiling "g0_kernel" - 0: 0%....50%....100% - 9 passes
==PROF== Profiling "g1_gemm_kernel" - 1: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 41877
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","%","nsecond","","","%"
"0","41877","python3.12","127.0.0.1","g0_kernel","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","88.41","12,512","0","0","91.27"
"1","41877","python3.12","127.0.0.1","g1_gemm_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","31.02","40,960","1,024","512","23.50"
"2","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","70.00","2,000","n/a","0","50.00"
"3","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","60.00","4,000","16","0","40.00"
"4","41877","python3.12","127.0.0.1","g0_kernel","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","88.59","12,488","0","0","91.33"
"5","41877","python3.12","127.0.0.1","g1_gemm_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","30.98","41,040","1,024","512","23.46"
"6","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","70.00","2,000","n/a","0","50.00"
"7","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","60.00","4,000","16","0","40.00"
"8","41877","python3.12","127.0.0.1","g0_kernel","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","88.50","12,500","0","0","91.30"
"9","41877","python3.12","127.0.0.1","g1_gemm_kernel","1","7","(128, 1, 1)","(132, 1, 1)","0","9.0","31.00","41,000","1,024","512","23.48"
"10","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","70.00","2,000","n/a","0","50.00"
"11","41877","python3.12","127.0.0.1","kw_softmax","1","7","(512, 1, 1)","(64, 1, 1)","0","9.0","60.00","4,000","16","0","40.00"
"""

GROUPS = [{"id": "g0", "strategy": "triton"}, {"id": "addmm", "strategy": "library"},
          {"id": "g1", "strategy": "triton"}, {"id": "g1+addmm", "strategy": "triton"},
          {"id": "g2", "strategy": "cuda"}, {"id": "g3", "strategy": "cuda"}, {"id": "g4", "strategy": "torch"}]

SOURCES = {
    "g0": "import triton\n\n\n@triton.jit\ndef g0_kernel(\n    in0,\n):\n    pass\n\n\ndef launch(a0):\n    pass\n",
    "g1_gemm": "@triton.jit\ndef g1_gemm_kernel(a, b):\n    pass\n\n\n@triton.jit\ndef g1_gemm_epilogue_kernel(c):\n    pass\n",
    "g2": '# CUDA kernel kw_softmax (row_softmax); knobs: {}\n_SRC_KERNEL = """extern "C" __global__ void '
          '__launch_bounds__(THREADS) kw_softmax(\n    const float* x)"""\n',
    "g3": '# CUDA kernel kw_softmax (row_softmax); knobs: {}\n',
}


def test_parse_csv_reads_every_launch_with_units_and_separators():
    launches = ncu.parse_csv(SAMPLE)
    assert len(launches) == 12
    first, gemm, soft = launches[0], launches[1], launches[2]
    assert first["kernel"] == "g0_kernel" and first["id"] == 0
    assert first["occupancy_pct"] == pytest.approx(91.27) and first["dram_pct"] == pytest.approx(88.41)
    assert first["duration_us"] == pytest.approx(12.512)  # nanoseconds, thousands separator, in us
    assert gemm["bank_conflicts_ld"] == 1024 and gemm["bank_conflicts_st"] == 512
    assert soft["bank_conflicts_ld"] is None  # "n/a"


def test_parse_csv_scales_durations_by_the_units_row_and_skips_other_output():
    text = SAMPLE.replace('"%","nsecond"', '"%","usecond"').replace('"12,512"', '"12.512"')
    text = "program output before the table\n" + text + "==PROF== Report done\n"
    assert ncu.parse_csv(text)[0]["duration_us"] == pytest.approx(12.512)
    assert ncu.parse_csv("==PROF== Disconnected from process 1\n") == []


def test_kernels_map_to_units_by_their_files():
    units_of = ncu.kernel_units(SOURCES, GROUPS)
    assert units_of == {"g0_kernel": ["g0"], "g1_gemm_kernel": ["g1+addmm"],
                        "g1_gemm_epilogue_kernel": ["g1+addmm"], "kw_softmax": ["g2", "g3"]}
    stems = ncu.unit_files(GROUPS)
    assert stems["g1_gemm"] == "g1+addmm" and stems["addmm_conv"] == "g1+addmm"
    assert "addmm" not in stems and "g4" not in stems  # library and torch units ship no kernel


def test_per_unit_sums_each_call_and_splits_a_shared_template_kernel():
    units = ncu.per_unit(ncu.parse_csv(SAMPLE), ncu.kernel_units(SOURCES, GROUPS), calls=3)
    assert set(units) == {"g0", "g1+addmm", "g2", "g3"}
    g0 = units["g0"]
    assert g0["duration_us"] == pytest.approx((12.512 + 12.488 + 12.5) / 3)
    assert g0["occupancy_pct"] == pytest.approx((91.27 + 91.33 + 91.30) / 3, rel=1e-4)
    assert g0["kernels"]["g0_kernel"]["launches_per_call"] == 1
    assert units["g1+addmm"]["bank_conflicts_ld"] == 1024 and units["g1+addmm"]["bank_conflicts_st"] == 512
    # kw_softmax launches alternate between g2 and g3, the units in program order
    assert units["g2"]["duration_us"] == pytest.approx(2.0) and units["g3"]["duration_us"] == pytest.approx(4.0)
    assert units["g2"]["occupancy_pct"] == pytest.approx(50.0) and units["g3"]["dram_pct"] == pytest.approx(60.0)
    assert units["g2"]["bank_conflicts_ld"] is None and units["g3"]["bank_conflicts_ld"] == 16


@pytest.mark.parametrize("text, want", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
     "on the target device 0.", "ERR_NVGPUCTRPERM"),
    ("==ERROR== Failed to profile kernel: LibraryNotLoaded", "LibraryNotLoaded"),
    ("==WARNING== No kernels were profiled.", "no kernel"),
    ("==ERROR== unrecognised option '--bogus'", "ncu failed: unrecognised option"),
])
def test_failures_say_why_in_one_line(text, want):
    why = ncu.failure(text)
    assert want in why and "\n" not in why
    assert ncu.failure("==PROF== Disconnected from process 1") is None


def test_attach_stores_counters_per_unit_and_the_status(tmp_path):
    result = {"device": "cuda", "mode": "any", "groups": [dict(g) for g in GROUPS],
              "modes": {"any": {"groups": [dict(g) for g in GROUPS]}}}
    units = ncu.per_unit(ncu.parse_csv(SAMPLE), ncu.kernel_units(SOURCES, GROUPS))
    ncu.attach(result, {"status": "ok", "mode": "any", "calls": 3, "launches": 12, "units": units})
    rows = {g["id"]: g for g in result["groups"]}
    assert rows["g0"]["ncu"]["duration_us"] == pytest.approx(12.5, rel=1e-3) and "ncu" not in rows["addmm"]
    assert result["modes"]["any"]["groups"][0]["ncu"] == rows["g0"]["ncu"]
    assert result["ncu"] == {"status": "ok", "mode": "any", "calls": 3, "launches": 12}
    assert ncu.summary_line(result).startswith("Nsight Compute: 4 units profiled (12 launches over 3 calls")
    json.dumps(result)  # result.json stays JSON


def test_without_ncu_or_a_gpu_the_profile_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    assert "not on PATH" in ncu.profile_output(tmp_path, {"device": "cuda"})["status"]
    monkeypatch.setattr(ncu, "ncu_path", lambda: "/usr/bin/true")
    assert "no CUDA GPU" in ncu.profile_output(tmp_path, {"device": "cpu"})["status"]
    result = ncu.attach({"groups": [dict(GROUPS[0])]}, {"status": "the run had no CUDA GPU: no kernel counters"})
    assert ncu.summary_line(result) == "Nsight Compute: the run had no CUDA GPU: no kernel counters"
    assert ncu.summary_line({}) is None


def test_a_failing_ncu_gives_its_reason(monkeypatch, tmp_path):
    """An ncu that prints ERR_NVGPUCTRPERM and no table: the profile's status names it."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "g0.py").write_text(SOURCES["g0"])
    (tmp_path / "model_new.py").write_text("class ModelNew: pass\n")
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "ncu_path", lambda: str(fake))
    got = ncu.profile_output(tmp_path, {"device": "cuda:0", "groups": [dict(GROUPS[0])]})
    assert "ERR_NVGPUCTRPERM" in got["status"] and got["log"] == "ncu.log"
    assert "ERR_NVGPUCTRPERM" in (tmp_path / "ncu.log").read_text()  # what ncu printed is kept beside result.json
    assert ncu.summary_line({"ncu": got}).endswith("(ncu's output: ncu.log)")
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + SAMPLE + "EOF\n")
    got = ncu.profile_output(tmp_path, {"device": "cuda:0", "mode": "any", "groups": [dict(GROUPS[0])]})
    assert got["status"] == "ok" and set(got["units"]) == {"g0"} and got["launches"] == 12


def _fake_ncu(folder, script: str):
    """An `ncu` executable in `folder` that runs `script` (sh) instead of profiling."""
    folder.mkdir(exist_ok=True)
    fake = folder / "ncu"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return folder


def test_report_ncu_stores_the_counters_and_shows_them(run, tmp_path, monkeypatch):
    """`report --ncu` on a recorded GPU run: the counters land in result.json, report.md's
    Nsight Compute table and report.html's units table."""
    from html_page import Page  # tests/html_page.py

    from test_report_html import gpu_run

    folder = gpu_run(tmp_path)
    bin_dir = _fake_ncu(tmp_path / "bin", "cat <<'EOF'\n" + SAMPLE + "EOF\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    p = run("report", folder, "--ncu")
    assert p.returncode == 0, p.stderr
    result = json.loads((folder / "result.json").read_text())
    g0 = result["groups"][0]["ncu"]
    assert g0["occupancy_pct"] == pytest.approx(91.3, abs=0.05) and g0["kernels"]["g0_kernel"]["launches_per_call"] == 1
    assert result["modes"]["any"]["groups"][0]["ncu"] == g0 and result["ncu"]["status"] == "ok"
    md = (folder / "report.md").read_text()
    assert "## Nsight Compute counters" in md and "| g0 | `g0_kernel` | 12.50 | 91% | 88% | 0 | 0 |" in md
    page = Page((folder / "report.html").read_text())
    assert "ncu us occupancy DRAM bank conflicts ld / st" in page.text
    assert "12.50 91% 88% 0 / 0" in page.text and "Nsight Compute: 1 unit profiled" in page.text


def test_without_ncu_the_run_says_so_and_succeeds(run, tmp_path, monkeypatch):
    from test_report_html import gpu_run

    folder = gpu_run(tmp_path)
    monkeypatch.setenv("PATH", str(_fake_ncu(tmp_path / "empty", "exit 1\n").parent))  # no ncu on it
    p = run("report", folder, "--ncu")
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0] == "kernelwright: Nsight Compute: Nsight Compute (ncu) is not on PATH: no kernel counters"
    assert "Nsight Compute (ncu) is not on PATH" in (folder / "report.md").read_text()
    assert "Nsight Compute (ncu) is not on PATH" in (folder / "report.html").read_text()
    assert json.loads((folder / "result.json").read_text())["ncu"]["status"].startswith("Nsight Compute (ncu)")


def test_a_profile_that_raises_costs_one_line_not_the_command(run, tmp_path, monkeypatch):
    from test_report_html import gpu_run

    folder = gpu_run(tmp_path)

    def broken(folder, result):
        raise RuntimeError("status file unreadable\nsecond line")

    monkeypatch.setattr(ncu, "profile_output", broken)
    p = run("report", folder, "--ncu")
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0] == ("kernelwright: Nsight Compute: profiling failed (RuntimeError: status file "
                                        "unreadable)")
