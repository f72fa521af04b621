"""Peak memory bandwidth and FLOP rates of target devices, for roofline times.

The NVIDIA H200 entry holds ceilings *measured* on the project's H200 (device copy, read +
write; matmul 8192³ per precision). The other GPU entries are datasheet peaks (dense, no
sparsity), which measured ceilings do not reach: roofline fractions against them look worse
than against measured ones. Replace any entry with measured numbers through a JSON file of
ceilings (`load_ceilings`), e.g. one written by the benchmark run:

    {"name": "NVIDIA H200", "mem_bw_gbs": 4210, "fp32_tflops": 51, "tf32_tflops": 392,
     "bf16_tflops": 767}

or keyed by device name: {"NVIDIA H200": {...}, "NVIDIA A100-SXM4-80GB": {...}}.
Keys are `DeviceSpec` field names; "copy_gbs" is accepted for "mem_bw_gbs".

Without a CUDA GPU and without a given name, `device_spec()` returns the H200 entry and says so
in its `note` (so `kernelwright inspect` works on a laptop, and the schedule spaces of `space/`
are the H200's there). With a GPU, the multiprocessor count and the opt-in shared memory per
block are read from `torch.cuda.get_device_properties` (a MIG slice has fewer SMs than the table's
device); the table holds them for named devices and for the CPU default.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kernelwright.errors import UserError

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    mem_bw_gbs: float  # achievable DRAM bandwidth, GB/s (1e9 bytes/s)
    fp32_tflops: float  # FP32 (CUDA cores, or IEEE fp32 matmul) TFLOP/s
    tf32_tflops: float  # TF32 tensor cores, TFLOP/s
    bf16_tflops: float  # BF16/FP16 tensor cores with fp32 accumulation, TFLOP/s
    sms: int  # streaming multiprocessors
    l2_bytes: int
    smem_per_block: int  # bytes of shared memory one block may use (the opt-in maximum)
    source: str = "datasheet"  # "measured", "datasheet", "ceilings file PATH", "estimate"
    note: str = ""  # why this entry was chosen (e.g. "no CUDA GPU: showing NVIDIA H200")
    regs_per_sm: int = 65536  # 32-bit registers per multiprocessor (64 Ki on sm_80 and sm_90)

    def peak_tflops(self, precision: str = "fp32", tensor_core_op: bool = True) -> float:
        """Peak for one op: tensor-core rates apply only to GEMM/conv (`tensor_core_op`)."""
        if not tensor_core_op or precision == "fp32":
            return self.fp32_tflops
        if precision == "tf32":
            return self.tf32_tflops
        if precision in ("bf16", "fp16"):
            return self.bf16_tflops
        raise UserError(f"unknown precision {precision!r}; choose one of fp32, tf32, bf16")

    def with_ceilings(self, ceilings: dict, source: str | None = None) -> "DeviceSpec":
        """A copy with the given fields replaced (unknown keys are ignored)."""
        fields = {f.name for f in dataclasses.fields(self)}
        upd = {k: v for k, v in _normalise_keys(ceilings).items() if k in fields}
        if source is not None:
            upd["source"] = source
        return dataclasses.replace(self, **upd)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# shared memory per block: 227 KiB on sm_90, 163 KiB on sm_80 (CUDA's opt-in maximum)
H200 = DeviceSpec("NVIDIA H200", 4210.0, 51.0, 392.0, 767.0, 132, 60 * MiB, 227 * KiB, source="measured")
H100_SXM = DeviceSpec("NVIDIA H100 SXM", 3350.0, 67.0, 494.7, 989.4, 132, 50 * MiB, 227 * KiB)
H100_PCIE = DeviceSpec("NVIDIA H100 PCIe", 2000.0, 51.2, 378.0, 756.0, 114, 50 * MiB, 227 * KiB)
A100_80 = DeviceSpec("NVIDIA A100 80GB", 2039.0, 19.5, 156.0, 312.0, 108, 40 * MiB, 163 * KiB)
A100_40 = DeviceSpec("NVIDIA A100 40GB", 1555.0, 19.5, 156.0, 312.0, 108, 40 * MiB, 163 * KiB)
CPU = DeviceSpec("generic CPU", 50.0, 1.0, 1.0, 1.0, 0, 32 * MiB, 0, source="estimate",
                 note="rough desktop-class numbers; nothing is timed on a CPU", regs_per_sm=0)

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H200, H100_SXM, H100_PCIE, A100_80, A100_40, CPU)}

DEFAULT = H200


def lookup(name: str) -> DeviceSpec | None:
    """The table entry for a device name as CUDA reports it ("NVIDIA H100 80GB HBM3"), or a
    short name ("h200", "a100", "cpu"); None when unknown."""
    key = name.strip().upper()
    for spec in DEVICES.values():
        if spec.name.upper() == key:
            return spec
    if key in ("CPU", "GENERIC CPU", "GENERIC"):
        return CPU
    if "H200" in key or "GH200" in key:
        return H200
    if "H100" in key or "H800" in key:
        return H100_PCIE if "PCIE" in key else H100_SXM
    if "A100" in key or "A800" in key:
        return A100_40 if ("40GB" in key or "PCIE-40" in key) else A100_80
    return None


def _normalise_keys(d: dict) -> dict:
    aliases = {"copy_gbs": "mem_bw_gbs", "bw_gbs": "mem_bw_gbs", "fp16_tflops": "bf16_tflops",
               "l2": "l2_bytes", "sm_count": "sms", "smem": "smem_per_block"}
    return {aliases.get(k, k): v for k, v in d.items()}


def load_ceilings(path: str | Path) -> dict:
    """Read a JSON file of measured ceilings: either one flat dict of `DeviceSpec` fields, or a
    dict keyed by device name. Returns the parsed dict; a bad file is a UserError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such ceilings file") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read ceilings: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: ceilings must be a JSON object")
    return data


def _ceilings_for(data: dict, name: str) -> dict | None:
    fields = {f.name for f in dataclasses.fields(DeviceSpec)}
    flat = _normalise_keys(data)
    if any(k in fields and k != "name" for k in flat):
        other = flat.get("name")
        if other and other != name and (lookup(other) is None or lookup(other) != lookup(name)):
            return None  # measured on another device
        return data
    for key, value in data.items():
        if isinstance(value, dict) and (key == name or (lookup(key) is not None and lookup(key) == lookup(name))):
            return value
    return None


def current_cuda_device_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001 - a broken CUDA setup means "no GPU" here
        pass
    return None


def device_spec(name: str | None = None, ceilings: str | Path | dict | None = None) -> DeviceSpec:
    """The spec for `name` (a table name or a CUDA device name), else for the current CUDA
    device, else the H200 entry with a note saying no GPU was found.

    `ceilings` (a path or a parsed dict; default: the file named by $KERNELWRIGHT_CEILINGS, if
    set) overrides the table's numbers with measured ones.
    """
    if name is not None:
        spec = lookup(name)
        if spec is None:
            known = ", ".join(DEVICES)
            raise UserError(f"unknown device {name!r}; known: {known} (or short names h200, h100, a100, cpu)")
    else:
        gpu = current_cuda_device_name()
        if gpu is None:
            spec = dataclasses.replace(DEFAULT, note=f"no CUDA GPU: showing {DEFAULT.name} ceilings")
        else:
            spec = lookup(gpu)
            if spec is None:
                spec = dataclasses.replace(_unknown_gpu(gpu), note=f"{gpu} is not in the table: "
                                           f"{DEFAULT.name} rates with this GPU's SMs and L2; measure its ceilings")
            elif spec.name != gpu:
                spec = dataclasses.replace(spec, note=f"CUDA device {gpu!r}")
            spec = dataclasses.replace(spec, **_gpu_properties(spec))
    if ceilings is None and os.environ.get("KERNELWRIGHT_CEILINGS"):
        ceilings = os.environ["KERNELWRIGHT_CEILINGS"]
    if ceilings is not None:
        data = ceilings if isinstance(ceilings, dict) else load_ceilings(ceilings)
        where = "given dict" if isinstance(ceilings, dict) else str(ceilings)
        picked = _ceilings_for(data, spec.name)
        if picked is not None:
            spec = spec.with_ceilings(picked, source=f"measured ({where})")
    return spec


def _gpu_properties(spec: DeviceSpec) -> dict:
    """The current CUDA device's SM count, opt-in shared memory per block and registers per SM,
    as `DeviceSpec` fields; `spec`'s values where a property cannot be read."""
    try:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"sms": int(props.multi_processor_count),
                "smem_per_block": int(getattr(props, "shared_memory_per_block_optin", spec.smem_per_block)),
                "regs_per_sm": int(getattr(props, "regs_per_multiprocessor", spec.regs_per_sm))}
    except Exception:  # noqa: BLE001 - a broken CUDA setup keeps the table's numbers
        return {}


def _unknown_gpu(name: str) -> DeviceSpec:
    spec = dataclasses.replace(DEFAULT, name=name, source="estimate")
    try:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        spec = dataclasses.replace(spec, l2_bytes=int(getattr(props, "L2_cache_size", spec.l2_bytes)))
    except Exception:  # noqa: BLE001
        pass
    return spec
