"""Nsight Compute counters of the emitted module's generated kernels (`optimize --ncu`, `report --ncu`).

`profile_output(folder, result)` runs the output folder's model_new.py in a child process under
`ncu --clock-control none --csv --page raw` (the GPU's own clocks, as the timing protocol measures
them): the runner script builds `ModelNew` from the problem text model_new.py carries (its
`get_init_inputs()` and `get_inputs()`, seeded), in the mode result.json describes, calls it
`WARMUP` times (Triton compiles, caches fill), then `CALLS` times between
`cudaProfilerStart`/`Stop`; ncu profiles only those calls (`--profile-from-start off`) and only
kernels whose names the generated sources define (`--kernel-name regex:...`). The CUDA-graph
replay is switched off in the child: replayed or not, the same kernels run, and each launch is
profiled on its own.

Per launch it reads `METRICS`: achieved occupancy, DRAM throughput (both % of peak), shared
memory bank conflicts of loads and stores, and the kernel's duration. `parse_csv` (pure) turns
ncu's raw CSV page into launches, `kernel_units` maps kernel names to result.json's units
(Triton kernels are named after their unit's kernel file: `g0_kernel`, `g0_partial`,
`g1_gemm_kernel`; CUDA C++ kernels by their template, `kw_softmax`, found in the unit's file), and
`per_unit` sums them per call. Without ncu, without a GPU, or when ncu cannot read the counters
(ERR_NVGPUCTRPERM: counters reserved to admin users; LibraryNotLoaded), the result says why in one
line instead; a run never fails for it.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# result key -> the ncu metric it reads
METRICS = {
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "bank_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "bank_conflicts_st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "duration_us": "gpu__time_duration.sum",
}
GENERATED = ("triton", "cuda")  # the strategies of units that ship a generated kernel
WARMUP, CALLS = 3, 3
TIMEOUT_S = 300
LOG = "ncu.log"  # the output folder's file with the ncu command line and everything it printed
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
# what ncu prints when it cannot profile, and the line kernelwright says instead
FAILURES = (
    ("ERR_NVGPUCTRPERM", "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM: counters are "
                         "reserved to admin users on this machine)"),
    ("LibraryNotLoaded", "ncu could not load its profiling library (LibraryNotLoaded)"),
    ("No kernels were profiled", "ncu profiled no kernel (no generated kernel ran in the profiled calls)"),
)


def parse_csv(text: str) -> list[dict]:
    """The launches in `ncu --csv --page raw` output `text`: a header row of column names (the
    launch's "ID", "Kernel Name", ..., then metric names), a row of units, one row per launch.
    ncu's own lines (`==PROF==`, `==WARNING==`) and the program's output around the table are
    skipped. Each launch: {"id", "kernel", and every METRICS key found: a float, durations in
    microseconds, or None where ncu printed n/a}."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(table))))
    if len(rows) < 2:
        return []
    header, units = rows[0], rows[1]
    name_col = next((i for i, h in enumerate(header) if h in ("Kernel Name", "Function Name", "Demangled Name")), None)
    if name_col is None:
        return []
    cols = {key: header.index(metric) for key, metric in METRICS.items() if metric in header}
    launches = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        launch = {"id": _number(row[0]), "kernel": row[name_col]}
        for key, col in cols.items():
            value = _number(row[col])
            if value is not None and key == "duration_us":
                value *= TIME_UNITS.get(units[col].strip() if col < len(units) else "", 1e-3)
            launch[key] = value
        launches.append(launch)
    return launches


def _number(text: str) -> float | None:
    """A value of ncu's CSV: digits with thousands separators ("1,024") or decimals; None for n/a."""
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def failure(text: str) -> str | None:
    """Why ncu output `text` holds no counters, in one line, or None when nothing says so."""
    for marker, why in FAILURES:
        if marker in text:
            return why
    errors = [line.split("==ERROR==", 1)[1].strip() for line in text.splitlines() if "==ERROR==" in line]
    return f"ncu failed: {errors[0][:200]}" if errors else None


def kernel_names(text: str) -> list[str]:
    """The GPU kernels a generated kernel file defines: Triton `@triton.jit` functions and CUDA C++
    `__global__` functions (their source is embedded in the file, with its name in a comment)."""
    names = re.findall(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def\s+(\w+)\s*\(", text)
    names += re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text)
    names += re.findall(r"^# CUDA kernel (\w+) ", text, flags=re.M)
    return list(dict.fromkeys(names))


def unit_files(groups: list[dict]) -> dict[str, str]:
    """Kernel file stem -> the unit (result.json's "groups" row id) it computes, for the units
    that ship a generated kernel: a unit's file is named by its id; a GEMM or convolution pair's
    (id "g1+addmm", "g3+g2+conv_0") by the unit it produces and its kind ("g1_gemm", "g3_conv")."""
    stems: dict[str, str] = {}
    for g in groups:
        if g.get("strategy") not in GENERATED:
            continue
        uid = str(g["id"])
        if "+" not in uid:
            stems.setdefault(uid, uid)
            continue
        for token in uid.split("+"):
            for kind in ("gemm", "conv"):
                stems[f"{token}_{kind}"] = uid  # a pair's kernel supersedes its units' own
    return stems


def kernel_units(sources: dict[str, str], groups: list[dict]) -> dict[str, list[str]]:
    """Kernel name -> the units launching it, in program order, from the kernel files `sources`
    (stem -> text). A Triton kernel belongs to its file's unit; a CUDA C++ template kernel
    (`kw_softmax`) may be shared by several units of one template."""
    stems = unit_files(groups)
    order = {str(g["id"]): i for i, g in enumerate(groups)}
    out: dict[str, list[str]] = {}
    for stem, text in sources.items():
        uid = stems.get(stem)
        if uid is None:
            continue
        for name in kernel_names(text):
            out.setdefault(name, [])
            if uid not in out[name]:
                out[name].append(uid)
    return {k: sorted(v, key=order.get) for k, v in out.items()}


def per_unit(launches: list[dict], units_of: dict[str, list[str]], calls: int = CALLS) -> dict[str, dict]:
    """Unit id -> its counters per call of the forward: every kernel it launched ("kernels": name
    -> launches per call and each metric's mean over its launches), and over all of them the
    summed duration and bank conflicts per call and the duration-weighted occupancy and DRAM
    throughput. A kernel shared by k units is credited launch by launch in program order (the
    i-th launch of a call to the (i mod k)-th unit)."""
    seen: dict[str, int] = {}
    by_unit: dict[str, dict[str, list[dict]]] = {}
    for launch in sorted(launches, key=lambda x: x.get("id") or 0):
        owners = units_of.get(launch["kernel"])
        if not owners:
            continue
        i = seen.get(launch["kernel"], 0)
        seen[launch["kernel"]] = i + 1
        by_unit.setdefault(owners[i % len(owners)], {}).setdefault(launch["kernel"], []).append(launch)
    out = {}
    for uid, kernels in by_unit.items():
        entry: dict = {"kernels": {}}
        for name, ls in kernels.items():
            k = {"launches_per_call": len(ls) / calls}
            for key in METRICS:
                vals = [x[key] for x in ls if x.get(key) is not None]
                k[key] = sum(vals) / len(vals) if vals else None
            entry["kernels"][name] = k
        every = [x for ls in kernels.values() for x in ls]
        dur = [x.get("duration_us") or 0.0 for x in every]
        total = sum(dur)
        entry["duration_us"] = total / calls
        for key in ("bank_conflicts_ld", "bank_conflicts_st"):
            vals = [x[key] for x in every if x.get(key) is not None]
            entry[key] = sum(vals) / calls if vals else None
        for key in ("occupancy_pct", "dram_pct"):
            pairs = [(x[key], d) for x, d in zip(every, dur) if x.get(key) is not None]
            weight = sum(d for _, d in pairs)
            entry[key] = (sum(v * d for v, d in pairs) / weight if weight else
                          sum(v for v, _ in pairs) / len(pairs) if pairs else None)
        out[uid] = entry
    return out


RUNNER = r'''
"""Runs an emitted model_new.py's forward for ncu: warm-up calls, then profiled calls.
argv: model_new.py, mode (train | eval | any), precision, warm-up calls, profiled calls, status file, device."""
import importlib.util, json, sys, warnings
import torch

path, mode, precision, status, device = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6], sys.argv[7]
warmup, calls = int(sys.argv[4]), int(sys.argv[5])
gpu = device.startswith("cuda")
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
spec = importlib.util.spec_from_file_location("kw_model_new_ncu", path)
mod = importlib.util.module_from_spec(spec)
sys.modules["kw_model_new_ncu"] = mod
spec.loader.exec_module(mod)
torch.manual_seed(0)
with torch.device(device):
    model = mod.ModelNew(*mod.get_init_inputs())
model = model.to(device)
if mode != "any":
    model.train(mode == "train")
model._kw_cuda_graphs = False  # the same kernels, each launch profiled on its own
torch.manual_seed(1)
with torch.device(device):
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
with warnings.catch_warnings(record=True) as caught, torch.no_grad():
    warnings.simplefilter("always")
    for _ in range(warmup):
        model(*inputs)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for _ in range(calls):
        model(*inputs)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
with open(status, "w") as f:
    json.dump({"ok": True, "calls": warmup + calls,
               "warnings": sorted({str(w.message).splitlines()[0] for w in caught})}, f)
'''


def ncu_path() -> str | None:
    return shutil.which("ncu")


def kernel_sources(folder: Path) -> dict[str, str]:
    """Kernel file stem -> text, from the output folder's kernels/ (the shared runtime files,
    `_*.py`, left out)."""
    kdir = Path(folder) / "kernels"
    if not kdir.is_dir():
        return {}
    return {p.stem: p.read_text(errors="replace") for p in sorted(kdir.glob("*.py")) if not p.name.startswith("_")}


def profile_output(folder: str | Path, result: dict, timeout_s: float = TIMEOUT_S) -> dict:
    """Profile the emitted module in `folder` under ncu: {"status": "ok", "mode", "calls",
    "units": unit id -> counters (`per_unit`)} or {"status": one line saying why there are none}."""
    folder = Path(folder)
    ncu = ncu_path()
    if ncu is None:
        return {"status": "Nsight Compute (ncu) is not on PATH: no kernel counters"}
    if str(result.get("device", "")).split(":")[0] != "cuda":
        return {"status": "the run had no CUDA GPU: no kernel counters"}
    mode = result.get("mode") or "any"
    groups = result.get("groups") or []
    sources = kernel_sources(folder)
    if not (folder / "kernels").is_dir():
        return {"status": "no kernels/ folder (a --single-file output?): only outputs with kernels/ are profiled"}
    units_of = kernel_units(sources, groups)
    if not units_of:
        return {"status": "no generated kernel ships in this module: nothing to profile"}
    if not (folder / "model_new.py").is_file():
        return {"status": f"no model_new.py in {folder}: nothing to profile"}
    if "ModelNew" not in (folder / "model_new.py").read_text(errors="replace"):
        return {"status": "model_new.py has no ModelNew (a Python-API module): not profiled"}
    with tempfile.TemporaryDirectory(prefix="kw_ncu_") as tmp:
        runner, status = Path(tmp) / "runner.py", Path(tmp) / "status.json"
        runner.write_text(RUNNER)
        names = "|".join(re.escape(n) for n in sorted(units_of))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the kernels run compiled
        cmd = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(METRICS.values()), "--profile-from-start", "off",
               "--kernel-name", f"regex:^({names})$", "--launch-count", str(CALLS * max(64, 8 * len(units_of))),
               sys.executable, str(runner), str(folder / "model_new.py"), mode, str(result.get("precision", "fp32")),
               str(WARMUP), str(CALLS), str(status), "cuda"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return {"status": f"ncu did not finish within {timeout_s:.0f} s: no kernel counters"}
        except OSError as e:
            return {"status": f"ncu could not start ({e.strerror})"}
        text = proc.stdout + "\n" + proc.stderr
        (folder / LOG).write_text(" ".join(cmd) + "\n" + text)  # what ncu printed, beside result.json
        launches = parse_csv(proc.stdout)
        why = None if launches else failure(text)
        if why is None and not launches:
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            why = f"ncu gave no counters (exit {proc.returncode}: {last[0].strip()[:200]})"
        if why is not None:
            return {"status": why, "log": LOG}
        ran = json.loads(status.read_text()) if status.is_file() else {}
    found = per_unit(launches, units_of, CALLS)
    out = {"status": "ok", "mode": mode, "calls": CALLS, "launches": len(launches), "log": LOG, "units": found}
    if ran.get("warnings"):
        out["warnings"] = ran["warnings"]
    return out


def attach(result: dict, profile: dict) -> dict:
    """Store `profile` in `result`: result["ncu"] holds its status (and mode, calls), and each
    profiled unit's row in "groups" (the profiled mode's rows under "modes" too) its counters
    under "ncu". Returns `result`."""
    units = profile.get("units") or {}
    result["ncu"] = {k: v for k, v in profile.items() if k != "units"}
    mode = profile.get("mode")
    tables = [result.get("groups") or []]
    if mode and mode in (result.get("modes") or {}):
        tables.append(result["modes"][mode].get("groups") or [])
    for table in tables:
        for g in table:
            g.pop("ncu", None)
            if g.get("id") in units:
                g["ncu"] = units[g["id"]]
    return result


def summary_line(result: dict) -> str | None:
    """One line on the counters of `result` (None when --ncu was not asked for)."""
    info = result.get("ncu")
    if not info:
        return None
    if info.get("status") != "ok":
        return f"Nsight Compute: {info.get('status')}" + (f" (ncu's output: {info['log']})" if info.get("log") else "")
    n = sum(1 for g in result.get("groups") or [] if g.get("ncu"))
    line = (f"Nsight Compute: {n} unit{'s' * (n != 1)} profiled ({info.get('launches')} launches over "
            f"{info.get('calls')} calls in {info.get('mode')} mode, --clock-control none)")
    if info.get("warnings"):  # the call guard ran the original forward: those kernels are not the generated ones
        line += "; the profiled calls warned: " + "; ".join(info["warnings"])
    return line
