"""Progress inside a unit's search: search_unit reports each trial through the `on_result`
callback `trial_counter` makes (trials done, the unit's budget, the best verified time so far), and
optimize's live status line (cli._progress) shows it; --quiet and non-terminals get no status line."""
import io

from rich.console import Console

from kernelwright import cli
from kernelwright.search import RunResult, TrialDB
from kernelwright.search.plan_search import TrialProgress, search_unit, trial_counter
from kernelwright.space.config import Config


class _Tuner:
    """A tuner whose candidates take 3, 2, 1.5 ms ...; the third one fails verification."""

    def __init__(self, space):
        self.space, self.seeds, self.on_hang = space, space[:2], None

    def run(self, configs):
        out = []
        for c in configs:
            i = self.space.index(c)
            out.append(RunResult.failure(c, "verify", "wrong") if i == 2 else RunResult(c, 3.0 / (1 + 0.5 * i)))
        return out


def test_search_unit_reports_every_trial_with_the_best_so_far(tmp_path):
    space = [Config.make("triton.row", BLOCK=b) for b in (16, 32, 64, 128, 256)]
    seen: list[TrialProgress] = []
    common = dict(db=TrialDB(tmp_path / "t.jsonl"), task_key="p/g0/row", task_features={}, precision="fp32",
                  on_result=trial_counter("g0", 4, seen.append))
    results = search_unit(_Tuner(space), 4, None, common)
    assert len(results) == 4
    assert [p.done for p in seen] == [1, 2, 3, 4] and {p.unit for p in seen} == {"g0"}
    assert {p.budget for p in seen} == {4}
    best = [p.best_ms for p in seen]
    assert best[:2] == [3.0, 2.0]  # the two seeds, in order
    ok = [r.time_ms for r in results if r.ok]
    assert best[-1] == min(ok) and all(a >= b for a, b in zip(best, best[1:]))  # never worse


def test_without_a_report_there_is_no_callback():
    assert trial_counter("g0", 4, None) is None
    seen = []
    count = trial_counter("g1", None, seen.append)
    count(RunResult.failure(Config.make("triton.row", BLOCK=16), "verify", "wrong"))
    assert seen == [TrialProgress("g1", 1, None, None)]  # a failed trial counts, sets no best


def test_the_status_line_shows_the_units_trials_and_best_time():
    console = Console(file=io.StringIO(), force_terminal=True)
    log, trial, status = cli._progress(False, console)
    trial(TrialProgress("g0", 2, 5, None))
    assert status.status == "0 done; g0: trial 2/5"
    trial(TrialProgress("g0", 3, 5, 0.01234))
    assert status.status == "0 done; g0: trial 3/5, best 0.012 ms"
    log("g0 [normalization] _softmax: triton 0.012 ms (5 trials, 0 failed)")
    assert status.status.startswith("1 done; searching the next unit (last: g0 [normalization]")
    trial(TrialProgress("g1", 1, None, 0.5))  # a time budget: no trial count to reach
    assert status.status == "1 done; g1: trial 1, best 0.500 ms"
    assert "g0 [normalization] _softmax" in console.file.getvalue()  # the unit's own line is printed
