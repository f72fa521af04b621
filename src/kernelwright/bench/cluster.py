"""bench on the workers of a Dask distributed cluster (`bench --cluster`).

`local:N` starts a cluster of N worker processes on this host, each with one thread under a nanny
that restarts it when it dies; on a GPU run worker i sees only GPU i (CUDA_VISIBLE_DEVICES) and
carries the resource GPU=1. `tcp://HOST:PORT` connects to a running scheduler whose workers were
started as `dask worker tcp://HOST:PORT --nthreads 1 --resources GPU=1` (one per GPU).

One task per problem (`bench_task`) runs runner._one with a trial database of its own, a JSON-lines
file in the worker's temporary folder seeded with the user's trials (a worker plugin writes them
there once per worker process), and returns the row and the trials it added. The client adds those
trials to the user's database as results arrive, so one process writes that file. The client keeps
one task per worker in flight: the scheduler would otherwise queue several on one worker, and a
worker's death counts against every task it holds. A worker that dies inside a problem (a hung or
faulting candidate ends its process through the hang guard, measure/watchdog.py) is restarted by its
nanny and the scheduler runs the problem again, on any worker; a rerun on the same host starts from
the trials the lost attempt recorded (the hung candidate among them), so it runs without that
candidate. A problem whose worker died in it twice on one host becomes an error row (as does one the
scheduler gave up on: KilledWorker); the other problems go on.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from kernelwright.errors import UserError
from kernelwright.problem.load import level_of

WORKER_DEATHS = 1  # reruns of a problem on one host after its worker died in it
ALLOWED_FAILURES = 3  # the local scheduler's allowed-failures: worker deaths a task survives, on any host
CONNECT_S = 10.0  # how long to try to reach a scheduler
WORKERS_S = 60.0  # how long to wait for a scheduler's first worker
QUIET = 40  # the cluster's log level here: errors only (logging.ERROR)
INSTALL = "pip install 'kernelwright[cluster]'"


def parse_cluster(text: str) -> tuple[str, int | str]:
    """("local", N) for local:N, ("tcp", address) for tcp://HOST:PORT; a UserError otherwise."""
    m = re.fullmatch(r"local:(\d+)", text.strip())
    if m:
        n = int(m.group(1))
        if n < 1:
            raise UserError(f"--cluster {text!r}: a local cluster needs at least 1 worker")
        return "local", n
    if re.fullmatch(r"tcp://[^\s:/]+:\d+", text.strip()):
        return "tcp", text.strip()
    raise UserError(f"--cluster {text!r}: expected local:N (N worker processes here) or tcp://HOST:PORT "
                    "(a running Dask scheduler)")


def require_distributed() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise UserError(f"--cluster needs Dask distributed, which is not installed ({INSTALL})") from None


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):  # (called outside a Dask worker: tests)
        return None


def _run_folder(run: str) -> Path:
    """This host's folder for the bench `run` (its trial history, one folder per problem)."""
    return Path(tempfile.gettempdir()) / "kernelwright-bench" / run


try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # (without distributed, --cluster stops in require_distributed)
    WorkerPlugin = object  # type: ignore[assignment,misc]


class History(WorkerPlugin):
    """The user's trials, written once per worker process (a restarted one too) to the run's
    folder, where each task's own database starts from them."""

    name = "kernelwright-history"

    def __init__(self, run: str, records: list[dict]):
        self.run, self.records = run, records

    def setup(self, worker=None) -> None:
        from kernelwright.search.database import TrialDB

        folder = _run_folder(self.run)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"history.{os.getpid()}.jsonl"
        tmp.write_text("")
        TrialDB(tmp).add_many(self.records)
        os.replace(tmp, folder / "history.jsonl")

    def teardown(self, worker=None) -> None:
        shutil.rmtree(_run_folder(self.run), ignore_errors=True)


def bench_task(path: str, opts: dict, run: str, token: str, n_history: int, one: Callable | None = None
               ) -> tuple[dict, list[dict]]:
    """Bench one problem on this worker: (its row, with the worker's address, and the trials the
    run added). Its database starts as the `n_history` trials of the run's history; `token` names
    the problem's folder (kept until the workers close), so that a rerun after a worker died in it
    finds the trials recorded so far and how often it started, or its finished result."""
    from kernelwright.bench.runner import _one
    from kernelwright.search.database import TrialDB

    if opts.get("device") == "cpu":  # (before the first kernel import in this worker)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    folder = _run_folder(run) / token
    db = TrialDB(folder / "trials.jsonl")
    if not db.path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        history = _run_folder(run) / "history.jsonl"
        if history.is_file():
            shutil.copyfile(history, folder / "seed.jsonl")
        else:  # (no history on this host)
            (folder / "seed.jsonl").write_text("")
            n_history = 0
        (folder / "seeded").write_text(str(n_history))
        os.replace(folder / "seed.jsonl", db.path)  # (whole, or not there: a rerun seeds it again)
    n_history = int((folder / "seeded").read_text())
    done = folder / "row.json"
    if done.is_file():  # it finished here before, and its result was lost with its worker: that result
        return json.loads(done.read_text()), list(db)[n_history:]
    starts = folder / "starts"
    with open(starts, "a") as fh:
        fh.write("x")
    if starts.stat().st_size > WORKER_DEATHS + 1:  # the worker died in it each time so far
        row = _died_row(path, DIED)
    else:
        row = (one or _one)(path, dict(opts, db_path=str(db.path)))
    row["worker"] = _worker_address()
    row = json.loads(json.dumps(row, default=str))
    (folder / "row.part").write_text(json.dumps(row))
    os.replace(folder / "row.part", done)
    return row, list(db)[n_history:]


DIED = ("crash: the worker process died inside this problem each time it ran (a hung or faulting kernel "
        "ends its worker; each such candidate is recorded in the trial database)")


def _died_row(path: str, why: str) -> dict:
    return {"problem": Path(path).stem, "path": path, "level": level_of(path), "correct": False, "error": why}


def _local_cluster(n: int, on_gpu: bool):
    """A cluster of n one-thread worker processes here (worker i on GPU i), its scheduler in this
    process."""
    from distributed import Nanny, Scheduler, SpecCluster

    if on_gpu:
        import torch

        have = torch.cuda.device_count()
        if n > have:
            raise UserError(f"--cluster local:{n}: {have} GPU(s) visible here; one worker per GPU")
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        ids = visible[:n] if len(visible) >= n else [str(i) for i in range(n)]
    workers = {}
    for i in range(n):
        options: dict = {"nthreads": 1, "memory_limit": 0, "env": {}, "silence_logs": QUIET}
        if on_gpu:
            options["env"]["CUDA_VISIBLE_DEVICES"] = ids[i]
            options["resources"] = {"GPU": 1}
        else:
            options["env"]["TRITON_INTERPRET"] = "1"
        workers[f"kw-{i}"] = {"cls": Nanny, "options": options}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": None,
                                               "allowed_failures": ALLOWED_FAILURES}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=QUIET, name="kernelwright")


def _connect(kind: str, target, on_gpu: bool):
    """(client, cluster or None) for a parsed --cluster value."""
    from distributed import Client

    if kind == "local":
        cluster = _local_cluster(int(target), on_gpu)
        return Client(cluster), cluster
    try:
        client = Client(str(target), timeout=CONNECT_S)
    except (OSError, TimeoutError) as e:
        raise UserError(f"--cluster {target}: no Dask scheduler answers there ({type(e).__name__})") from None
    try:
        client.wait_for_workers(1, timeout=WORKERS_S)
    except TimeoutError:
        client.close()
        raise UserError(f"--cluster {target}: the scheduler has no workers after {WORKERS_S:.0f} s "
                        f"(start them with `dask worker {target} --nthreads 1 --resources GPU=1`)") from None
    workers = client.scheduler_info()["workers"].values()
    if on_gpu and not any((w.get("resources") or {}).get("GPU") for w in workers):
        client.close()
        raise UserError(f"--cluster {target}: no worker has a GPU resource (start them with "
                        f"`dask worker {target} --nthreads 1 --resources GPU=1`)")
    return client, None


def run_cluster(spec: str, paths: list[str], opts: dict, on_row: Callable[[dict], None], *,
                db_path=None, echo: Callable[[str], None] = print, one: Callable | None = None,
                live: bool | None = None) -> None:
    """Bench `paths` on the cluster `spec` (a --cluster value); `on_row(row)` as rows arrive, after
    their trials are in the trial database `db_path` (default: the user's). `one(path, opts) -> row`
    benches one problem on a worker (default runner._one). `live`: a progress bar with each
    worker's problem (default: when stdout is a terminal); otherwise the rows are the progress."""
    kind, target = parse_cluster(spec)
    require_distributed()
    from distributed import as_completed

    from kernelwright.search.database import TrialDB

    on_gpu = opts.get("device", "cuda") == "cuda"
    user_db = TrialDB(db_path)
    history = list(user_db)
    client, cluster = _connect(kind, target, on_gpu)
    try:
        echo(f"cluster {spec}: {len(client.scheduler_info()['workers'])} worker(s), "
             f"scheduler {client.scheduler.address}")
        run = uuid.uuid4().hex[:12]
        client.register_plugin(History(run, history))
        todo = list(enumerate(paths))
        futures: dict = {}
        ac = as_completed()

        def submit() -> None:
            """Tasks up to one per worker (at least one) in flight."""
            while todo and len(futures) < max(1, len(client.scheduler_info()["workers"])):
                i, path = todo.pop(0)
                fut = client.submit(bench_task, path, opts, run, f"p{i}", len(history), one,
                                    key=f"{Path(path).stem}-{run}-{i}", resources={"GPU": 1} if on_gpu else None,
                                    retries=1, pure=False)
                futures[fut] = path
                ac.add(fut)

        def finish(fut) -> None:
            path = futures.pop(fut)
            try:
                row, trials = fut.result()
            except Exception as e:  # noqa: BLE001 - a lost worker (KilledWorker) or a failed task
                why = DIED if type(e).__name__ == "KilledWorker" else \
                    f"crash: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                row, trials = _died_row(path, why), []
            fut.release()  # (the scheduler forgets it: a worker lost later does not recompute it)
            user_db.add_many(trials)
            on_row(row)
            submit()

        submit()
        if live is None:
            live = sys.stdout.isatty()
        if live:
            _with_progress(client, ac, len(paths), finish)
        else:
            for fut in ac:
                finish(fut)
    finally:
        try:  # (each worker's teardown removes the run's folder on its host)
            client.unregister_worker_plugin(History.name)
        except Exception:  # noqa: BLE001 - (no plugin registered yet, or the scheduler gone)
            pass
        client.close()
        if cluster is not None:
            cluster.close()


def _with_progress(client, ac, total: int, finish: Callable) -> None:
    """Results as they finish (`ac`: an as_completed over the submitted tasks), below a rich progress bar over the problems and one status line per worker (the
    problem it runs, polled from the scheduler)."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    bar = Progress(TextColumn("problems"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("problems", total=total)
    workers = Text()

    def status() -> None:
        try:
            processing = client.processing()
        except Exception:  # noqa: BLE001 - (the scheduler busy or gone: keep the last status)
            return
        lines = [f"{w}: {', '.join(str(k).rsplit('-', 2)[0] for k in keys) or 'idle'}"
                 for w, keys in sorted(processing.items())]
        workers.plain = "\n".join(lines)

    with Live(Group(bar, workers), refresh_per_second=4, redirect_stdout=True, redirect_stderr=False):
        last = 0.0
        while not ac.is_empty():
            for fut in ac.next_batch(block=False):
                finish(fut)
                bar.advance(task)
            if time.monotonic() - last > 1.0:
                status()
                last = time.monotonic()
            time.sleep(0.1)
