"""Shared test fixtures, and the Triton mode of the whole run.

On a machine without a CUDA GPU, Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is
set here, when pytest loads this file and before any test module imports triton (Triton reads it
when a kernel is defined). A value the caller set is kept, so a GPU machine runs compiled kernels
unless TRITON_INTERPRET=1 is asked for (as `make test` does); then the `interpreter` tests skip.
Trials go to a database of the test process's own ($KERNELWRIGHT_DB, unless the caller set one)."""
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

if os.environ.get("TRITON_INTERPRET") is None and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# the trial database of this test process (and the CLI runs it starts): never the user's own
if not os.environ.get("KERNELWRIGHT_DB"):
    import tempfile

    os.environ["KERNELWRIGHT_DB"] = os.path.join(tempfile.mkdtemp(prefix="kw-tests-"), "trials.sqlite")

# pytest-xdist's workers share the machine's cores: each worker's torch (and the CLI runs it
# starts) gets its share of them, so parallel workers do not oversubscribe the cores with intra-op
# threads (the interpreted tests run many small ops, which extra threads only slow down)
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _workers > 1 and not torch.cuda.is_available():
    _share = str(max(1, (os.cpu_count() or 1) // _workers))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402


def _skip_dead_overflow_checks():
    """Triton's interpreter computes every int32 add, sub and mul a second time in int64 to check it
    for overflow, then hands the check to `device_assert`, which does nothing unless the interpreter
    runs with debug on (its options never do): about 40% of an interpreted kernel's time goes to
    results nobody reads. With debug off this turns the computation off; values and every check
    that can fail stay the same."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import dataclasses

    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    if not options.debug and getattr(options, "sanitize_overflow", False):
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)


_skip_dead_overflow_checks()


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


def pytest_configure(config):
    # pytest-xdist's mark (registered by xdist itself when it is installed): tests of one group run in
    # one worker process, where they share what module- and session-scoped fixtures made
    config.addinivalue_line("markers", "xdist_group(name): run in the same pytest-xdist worker as the group's other tests")


@pytest.fixture(scope="session")
def small_capture():
    """small_capture(path): the graph of the problem file at its SMALL sizes (`capture(load_problem(
    path, small=True))`), captured once per session for the tests that read it (treat it as read-only).
    Tests sharing it carry `xdist_group("small_captures")`, so that they run in one worker."""
    from kernelwright.capture import capture
    from kernelwright.problem import load_problem

    graphs = {}

    def get(path):
        key = str(Path(path).resolve())
        if key not in graphs:
            graphs[key] = capture(load_problem(path, small=True))
        return graphs[key]
    return get


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
