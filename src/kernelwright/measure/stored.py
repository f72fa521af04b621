"""The final timing of an emitted module, kept in the trial database for a re-run of the same job.

A second `optimize` of a tuned problem emits the same files (every unit's stored best runs again);
timing them beside eager and a fresh torch.compile once more costs more than the rest of the run.
The timing is stored under a key of everything it depends on: the bytes of model_new.py and
kernels/, the problem's text and sizes, the precision policy, the torch.compile mode, the training
mode, and the versions of kernelwright, torch and Triton; the record names the GPU. A re-run that
finds its key on the same GPU reports that timing, marked as reused with the date it was measured
(verification still runs on every call); `--retune` measures again.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

TEMPLATE = "kernelwright.final"  # the trial records' template name: no search reads these records


def module_key(path: Path, *context) -> str:
    """A digest of model_new.py at `path`, every file of kernels/ beside it, and `context`."""
    import torch
    import triton

    from kernelwright import __version__

    h = hashlib.sha256()
    for f in [Path(path)] + sorted((Path(path).parent / "kernels").glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(repr((context, __version__, torch.__version__, triton.__version__)).encode())
    return h.hexdigest()[:32]


class StoredTimings:
    """Final timings in `db` (a search.database.TrialDB) for GPU `device` and policy `precision`."""

    def __init__(self, db, device: str, precision: str):
        self.db, self.device, self.precision = db, device, precision

    def get(self, key: str) -> dict | None:
        """The latest timing stored under `key`, with "reused" saying when it was measured; None."""
        recs = self.db.records(template=TEMPLATE, task_key=f"final/{key}", device=self.device,
                               precision=self.precision)
        recs = [r for r in recs if isinstance(r.get("timing"), dict)]
        if not recs:
            return None
        rec = max(recs, key=lambda r: r.get("timestamp") or 0)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.get("timestamp") or 0))
        return {**rec["timing"], "reused": {"measured": when, "key": key}}

    def put(self, key: str, timing: dict) -> None:
        kw = (timing.get("kernelwright") or {}).get("median_ms")
        self.db.add({"task_key": f"final/{key}", "template": TEMPLATE, "config": {"template": TEMPLATE},
                     "device": self.device, "precision": self.precision, "time_ms": kw, "error": None,
                     "timing": {k: v for k, v in timing.items() if k != "reused"}})
