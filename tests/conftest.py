"""Shared test fixtures, and the Triton mode of the whole run.

On a machine without a CUDA GPU, Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is
set here, when pytest loads this file and before any test module imports triton (Triton reads it
when a kernel is defined). A value the caller set is kept, so a GPU machine runs compiled kernels
unless TRITON_INTERPRET=1 is asked for (as `make test` does); then the `interpreter` tests skip."""
import os
import sys
from types import SimpleNamespace

import torch

if os.environ.get("TRITON_INTERPRET") is None and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `interpreter` run Triton kernels on CPU tensors, which only the interpreter can:
    with TRITON_INTERPRET unset on a GPU machine (compiled kernels, for the GPU tests) they skip."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(reason="Triton kernels on CPU tensors need TRITON_INTERPRET=1")
    for item in items:
        if item.get_closest_marker("interpreter"):
            item.add_marker(skip)

from kernelwright.codegen import library_epilogue  # noqa: E402
from kernelwright.search import units  # noqa: E402


@pytest.fixture
def fake_clock(monkeypatch):
    """Installs a search clock that calls every function once, as the real one does (so a library
    path that cannot run fails here too), and reports fixed times: `library_ms` for the library
    path, `kernel_ms` for generated kernels, `lt_ms` for the cuBLASLt-epilogue candidate (default:
    half a millisecond slower than the kernels). Trials are recorded under a fake GPU name."""
    def install(library_ms, kernel_ms, lt_ms=None, device="cpu"):
        lt = kernel_ms + 0.5 if lt_ms is None else lt_ms

        def time_fns(fns, device):
            for fn in fns.values():
                fn()
            return {k: library_ms if k == "__library__" else lt if k.startswith(library_epilogue.NAME) else kernel_ms
                    for k in fns}

        monkeypatch.setattr(units, "_time_fns", time_fns)
        if torch.device(device).type != "cuda":  # the timed path names the GPU its trials ran on
            monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake-gpu")
    return install


@pytest.fixture
def run(monkeypatch):
    """Runs the command line in this process as `python -m kernelwright ARGS` would: through
    `kernelwright.cli.main()`, which turns bad input into its one line and exit code 2 (typer's `app`
    alone would raise it), with typer's CliRunner capturing stdout and stderr. Returns the exit code,
    stdout and stderr under the names a subprocess result gives them."""
    from typer.testing import CliRunner

    from kernelwright import cli

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    runner = CliRunner()

    def call(*args):
        monkeypatch.setattr(sys, "argv", ["kernelwright", *map(str, args)])
        with runner.isolation() as (out, err, _):
            with pytest.raises(SystemExit) as exit_:
                cli.main()
            sys.stdout.flush()
            sys.stderr.flush()
            return SimpleNamespace(returncode=exit_.value.code, stdout=out.getvalue().decode(),
                                   stderr=err.getvalue().decode())
    return call
