"""Unit tests for kernelwright.search on a dummy runner with a known time function."""
import json
import math
import random
import time

import numpy as np
import pytest

from kernelwright.search import (CandidateCache, CostModel, Exhaustive, ModelBased,
                                 RandomSearch, RunResult, TrialDB, choose_strategy,
                                 default_db_path, make_record, task_feature_fn, tune)
from kernelwright.space import Axis, Config, Space, pow2_range

# --- a synthetic problem -------------------------------------------------------------

SPACE = Space("rowwise", [Axis("BLOCK", pow2_range(16, 8192)),      # 10 values
                          Axis("num_warps", [1, 2, 4, 8, 16]),       # 5
                          Axis("num_stages", [1, 2, 3, 4])])         # 4  -> 200 configs
CONFIGS = SPACE.configs()


def fails(c):
    return c["BLOCK"] == 8192 and c["num_warps"] == 1


def true_time(c, opt=10.0):
    """Known optimum at BLOCK=2**opt, num_warps=4, num_stages=2, plus a small fixed jitter."""
    b, w, s = math.log2(c["BLOCK"]), math.log2(c["num_warps"]), c["num_stages"]
    jitter = random.Random(c.key()).random() * 0.02
    return 1.0 + (b - opt) ** 2 + 0.5 * (w - 2) ** 2 + 0.3 * (s - 2) ** 2 + jitter


OPTIMUM = min((c for c in CONFIGS if not fails(c)), key=true_time)
assert OPTIMUM == Config.make("rowwise", BLOCK=1024, num_warps=4, num_stages=2)


def make_runner(opt=10.0, calls=None):
    def run(configs):
        if calls is not None:
            calls.append(list(configs))
        out = []
        for c in configs:
            if fails(c):
                out.append(RunResult.failure(c, "compile", "out of registers"))
            elif c["num_warps"] == 16 and c["BLOCK"] == 16:
                out.append(RunResult(c, time_ms=0.001, error="wrong: max excess 3.5", excess=3.5))
            else:
                out.append(RunResult(c, time_ms=true_time(c, opt), excess=0.0))
        return out
    return run


def trials_to_optimum(strategy, batch=8):
    strategy.bind(CONFIGS)
    run = make_runner()
    n = 0
    while batch_cfgs := strategy.ask(batch):
        if OPTIMUM in batch_cfgs:
            return n + batch_cfgs.index(OPTIMUM) + 1
        n += len(batch_cfgs)
        strategy.tell(run(batch_cfgs))
    raise AssertionError("optimum never asked")


def spearman(a, b):
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


# --- results ---------------------------------------------------------------------------

def test_run_result_ok_and_errors():
    c = CONFIGS[0]
    assert RunResult(c, 1.5).ok
    r = RunResult.failure(c, "timeout", "compile took 60 s")
    assert not r.ok and r.error == "timeout: compile took 60 s" and r.error_kind == "timeout"
    assert not RunResult(c, 1.0, error="wrong: excess 1e-2").ok      # timed but wrong
    assert not RunResult(c).ok                                         # nothing reported
    assert not RunResult(c, float("nan")).ok
    assert RunResult(c, 2.0).extra == {} and RunResult(c, 2.0).extra is not RunResult(c, 2.0).extra


# --- strategies ------------------------------------------------------------------------

def test_exhaustive_in_order_and_finds_optimum():
    s = Exhaustive().bind(CONFIGS + CONFIGS[:5])       # duplicates dropped
    seen = []
    while b := s.ask(7):
        seen += b
    assert seen == CONFIGS and s.done and s.ask(3) == []
    res = tune(CONFIGS, make_runner(), strategy=Exhaustive())
    assert res.best.config == OPTIMUM and res.stopped == "exhausted"
    assert len(res.results) == 200 and res.n_failed == 4 + 4  # 4 compile errors, 4 wrong


def test_random_search_no_repeats_and_seeded():
    a = RandomSearch(seed=3).bind(CONFIGS)
    got = []
    while b := a.ask(9):
        got += b
    assert len(got) == len(set(got)) == 200
    assert RandomSearch(seed=3).bind(CONFIGS).ask(9) == got[:9]
    assert RandomSearch(seed=4).bind(CONFIGS).ask(9) != got[:9]


def test_model_based_never_repeats():
    s = ModelBased(seed=1).bind(CONFIGS[:40])
    got = []
    run = make_runner()
    while b := s.ask(6):
        got += b
        s.tell(run(b))
    assert sorted(c.key() for c in got) == sorted(c.key() for c in CONFIGS[:40])


def test_model_based_beats_random():
    model = [trials_to_optimum(ModelBased(seed=s)) for s in range(5)]
    # random needs (200 + 1) / 2 trials on average to hit the one optimum among 200;
    # random search is cheap, so average it over many seeds for a steady baseline
    rand = [trials_to_optimum(RandomSearch(seed=s)) for s in range(40)]
    assert 70 < np.mean(rand) < 130
    assert np.mean(model) < 40, model
    assert np.mean(model) < 0.5 * np.mean(rand), (model, np.mean(rand))


def test_choose_strategy():
    assert isinstance(choose_strategy(30, 40), Exhaustive)
    assert isinstance(choose_strategy(200, 40), ModelBased)
    assert isinstance(choose_strategy(8, None), Exhaustive)
    assert isinstance(choose_strategy(200, None), ModelBased)


# --- tune: budgets and errors ----------------------------------------------------------

def test_budget_trials():
    calls = []
    res = tune(CONFIGS, make_runner(calls=calls), budget_trials=13, batch_size=5)
    assert res.n_run == len(res.results) == 13 and res.stopped == "trials"
    assert [len(b) for b in calls] == [5, 5, 3]
    assert len({r.config for r in res.results}) == 13


def test_budget_seconds_fake_clock():
    now = [0.0]
    run = make_runner()

    def slow_run(configs):
        now[0] += 0.1 * len(configs)
        return run(configs)

    res = tune(CONFIGS, slow_run, budget_s=2.0, batch_size=8, clock=lambda: now[0])
    assert res.stopped == "time"
    # 2.0 s at 0.1 s per trial: 20 trials; batches shrink to fit the remaining time
    assert 20 <= res.n_run <= 21, res.n_run
    # both budgets: the first reached stops
    now[0] = 0.0
    res = tune(CONFIGS, slow_run, budget_trials=100, budget_s=1.0, clock=lambda: now[0])
    assert res.stopped == "time" and res.n_run < 100
    now[0] = 0.0
    res = tune(CONFIGS, slow_run, budget_trials=5, budget_s=100.0, clock=lambda: now[0])
    assert res.stopped == "trials" and res.n_run == 5


def test_budget_seconds_wall_clock():
    run = make_runner()

    def sleepy(configs):
        time.sleep(0.01 * len(configs))
        return run(configs)

    t0 = time.monotonic()
    res = tune(CONFIGS, sleepy, budget_s=0.15, batch_size=4, strategy=RandomSearch(0))
    took = time.monotonic() - t0
    assert res.stopped == "time" and 4 <= res.n_run < 40
    assert took < 1.0  # generous: the machine may be loaded


def test_errors_are_results_not_exceptions():
    state = {"n": 0}
    run = make_runner()

    def flaky(configs):
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("illegal memory access\nwhole context lost")
        if state["n"] == 3:
            return run(configs)[:-1]             # drops one result
        return run(configs)

    res = tune(CONFIGS, flaky, budget_trials=40, batch_size=8, strategy=Exhaustive())
    assert len(res.results) == 40
    crashed = [r for r in res.results if r.error_kind == "crash"]
    assert len(crashed) == 8 + 1
    assert all("\n" not in r.error for r in crashed)
    assert "illegal memory access" in crashed[0].error
    assert res.best is not None and res.best.ok
    # a wrong-but-fast result is never best
    res = tune([c for c in CONFIGS if c["BLOCK"] == 16], make_runner(), strategy=Exhaustive())
    assert res.best.config["num_warps"] != 16 and res.n_failed == 4


# --- database --------------------------------------------------------------------------

def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELWRIGHT_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "kernelwright" / "trials.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_db_path() == tmp_path / ".cache" / "kernelwright" / "trials.sqlite"
    monkeypatch.setenv("KERNELWRIGHT_DB", str(tmp_path / "env.jsonl"))
    assert default_db_path() == tmp_path / "env.jsonl"
    assert default_db_path(tmp_path / "cli.jsonl") == tmp_path / "cli.jsonl"


@pytest.mark.parametrize("name", ["trials.jsonl", "trials.sqlite"])
def test_db_round_trip_and_truncation(tmp_path, name):
    """Both stores keep every field of every record, in order, and answer the same queries."""
    db = TrialDB(tmp_path / "sub" / name)
    assert db.sqlite == name.endswith(".sqlite")
    assert db.records() == [] and db.best("t") is None and not db.path.exists()
    run = make_runner()
    results = run(CONFIGS[:30])
    db.add_many(make_record(r, "taskA", {"log2_numel": 20.0, "op": "softmax"}, "H200", "fp32")
                for r in results)
    db.add_result(RunResult(Config.make("other", X=1), 0.5), "taskB", {}, "cpu", "fp32")
    recs = db.records()
    assert len(recs) == 31 and db.path.exists()
    r0 = recs[0]
    for k in ("task_key", "task_features", "template", "config", "time_ms", "error", "excess",
              "device", "precision", "version", "timestamp"):
        assert k in r0
    assert Config.from_json(r0["config"]) == CONFIGS[0]
    assert len(db.records(template="rowwise")) == 30 and len(db.records(device="cpu")) == 1
    best = db.best("taskA")
    assert Config.from_json(best["config"]) == min((r for r in results if r.ok),
                                                   key=lambda r: r.time_ms).config
    back = db.results("taskA")
    assert [(r.config, r.time_ms, r.error) for r in back] == [(r.config, r.time_ms, r.error) for r in results]

    if db.sqlite:
        db.add_result(RunResult(CONFIGS[40], 0.25), "taskA", device="H200", precision="fp32")
        assert len(db.records()) == 32 and db.best("taskA")["time_ms"] == 0.25
        assert len(TrialDB(db.path)) == 32  # another handle (another process) sees every record
        return
    # a writer died mid-line: the broken line is skipped, the next add starts a fresh line
    with open(db.path, "a") as f:
        f.write('{"task_key": "taskA", "config": {"templ')
    assert len(db.records()) == 31 and db.skipped_lines == 1
    db.add_result(RunResult(CONFIGS[40], 0.25), "taskA", device="H200", precision="fp32")
    assert len(db.records()) == 32
    assert db.best("taskA")["time_ms"] == 0.25
    for line in open(db.path):
        pass
    assert json.loads(line)["time_ms"] == 0.25


# --- cost model --------------------------------------------------------------------------

def _records(task_key, task_features, opt, configs):
    return [make_record(r, task_key, task_features, "H200", "fp32") for r in make_runner(opt)(configs)]


def test_cost_model_prior_with_few_records():
    m = CostModel()
    mean, std = m.predict([{"BLOCK": 10.0}, {"BLOCK": 4.0}])
    assert not m.fitted and mean.shape == (2,) and np.all(std > 0) and mean[0] == mean[1]
    m.fit(_records("a", {}, 10.0, CONFIGS[:2]))
    assert not m.fitted
    assert m.rank(CONFIGS[:5]) == CONFIGS[:5]


def test_cost_model_transfers_across_tasks():
    rng = random.Random(0)
    train = rng.sample(CONFIGS, 80)
    model = CostModel().fit(_records("A", {"log2_numel": 20.0, "row": 10.0}, 10.0, train))
    assert model.fitted
    test = [c for c in CONFIGS if not fails(c) and not (c["num_warps"] == 16 and c["BLOCK"] == 16)]
    mean, std = model.predict_configs(test, {"log2_numel": 21.0, "row": 10.5})
    truth = [true_time(c, 10.5) for c in test]
    rho = spearman(mean, truth)
    assert rho > 0.5, rho
    assert model.rank(test, {"log2_numel": 21.0})[0] != test[0]


def test_cost_model_failures_penalty_or_excluded():
    recs = _records("A", {}, 10.0, CONFIGS)
    bad = [c for c in CONFIGS if fails(c)]
    pen = CostModel(failures="penalty").fit(recs)
    exc = CostModel(failures="exclude").fit(recs)
    fn = task_feature_fn({})
    m_pen, _ = pen.predict([fn(c) for c in bad])
    m_exc, _ = exc.predict([fn(c) for c in bad])
    assert np.all(m_pen > m_exc)
    worst_ok = max(math.log(r["time_ms"]) for r in recs if r["error"] is None)
    assert np.mean(m_pen) > worst_ok - 0.5


# --- tune with a database: experience is reused -----------------------------------------

def test_second_tune_reuses_db(tmp_path):
    db = TrialDB(tmp_path / "t.jsonl")
    feats = {"log2_numel": 20.0}
    first = tune(CONFIGS, make_runner(), budget_trials=40, db=db, task_key="T",
                 task_features=feats, device="H200", precision="fp32", seed=1)
    assert first.strategy == "model" and len(db.records(task_key="T")) == 40

    second = tune(CONFIGS, make_runner(), budget_trials=8, batch_size=8, db=db, task_key="T",
                  task_features=feats, device="H200", precision="fp32", seed=2)
    first_batch = [true_time(c.config) for c in second.results[:8]]
    space_times = sorted(true_time(c) for c in CONFIGS)
    top_decile = space_times[len(space_times) // 10]
    # a random batch of 8 holds 0.8 configs of the top 10% on average, and its median is
    # the space's median; a share of model picks is random exploration, hence the median
    assert sum(t <= top_decile for t in first_batch) >= 3, first_batch
    assert np.median(first_batch) < 0.5 * np.median(space_times), first_batch
    assert second.best.time_ms <= first.best.time_ms * 1.05

    # a similar new task profits from the same records (task features in the model)
    other = tune(CONFIGS, make_runner(10.5), budget_trials=8, db=db, task_key="T2",
                 task_features={"log2_numel": 21.0}, device="H200", precision="fp32", seed=3)
    assert np.median([true_time(r.config, 10.5) for r in other.results]) < 0.5 * np.median(
        [true_time(c, 10.5) for c in CONFIGS])


def test_candidate_cache_skips_known(tmp_path):
    db = TrialDB(tmp_path / "t.jsonl")
    tune(CONFIGS[:20], make_runner(), db=db, task_key="T", strategy=Exhaustive())
    cache = CandidateCache.from_db(db, task_key="T")
    assert len(cache) == 20 and ("T", CONFIGS[0]) in cache and ("U", CONFIGS[0]) not in cache
    calls = []
    res = tune(CONFIGS[:30], make_runner(calls=calls), db=db, task_key="T",
               strategy=Exhaustive(), cache=cache)
    ran = [c for b in calls for c in b]
    assert ran == CONFIGS[20:30] and res.n_run == 10 and res.n_cached == 20
    assert len(res.results) == 30 and len(db.records(task_key="T")) == 30
    assert len(cache) == 30


def test_budget_shares_follow_bytes_with_a_minimum_per_unit():
    from kernelwright.search.budget import shares

    # a 300 KB weight copy, a 400 MB input copy and a 1.6 GB norm share 12 trials
    got = shares(12, [3e5, 4e8, 1.6e9], 2)
    assert got[0] == 2 and got[2] == pytest.approx(8) and got[1] == pytest.approx(2) and sum(got) == pytest.approx(12)
    assert shares(12, [1.0, 1.0, 1.0], 2) == pytest.approx([4, 4, 4])
    assert shares(3, [1.0, 5.0, 9.0], 2) == [2, 2, 2]  # the minimums alone exceed the total
    assert shares(10, [0.0, 0.0], 2) == pytest.approx([5, 5])
    assert shares(10, [], 2) == []


def _write_records(path, writer, n):
    from kernelwright.search import RunResult, TrialDB

    db = TrialDB(path)
    for i in range(n):
        cfg = Config.make("triton.row", BLOCK_M=16, WRITER=writer, I=i)
        db.add_result(RunResult(cfg, 1.0 + i, extra={"pad": "x" * (50 * (i % 40))}), f"p{writer}/g0/row",
                      {"kind": "reduction"}, "GPU X", "fp32")


@pytest.mark.parametrize("name", ["trials.jsonl", "trials.sqlite"])
def test_concurrent_writers_lose_no_record(tmp_path, name):
    """Processes appending to one trial database at once: every record arrives whole (JSON lines:
    one write per record on an O_APPEND descriptor; SQLite: one transaction per write, WAL), none
    is lost or interleaved."""
    import multiprocessing

    from kernelwright.search import TrialDB

    path = tmp_path / name
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_records, args=(path, w, 150)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    db = TrialDB(path)
    recs = list(db)
    assert db.skipped_lines == 0 and len(recs) == 600
    seen = {(r["task_key"], r["config"]["params"]["I"]) for r in recs}
    assert seen == {(f"p{w}/g0/row", i) for w in range(4) for i in range(150)}


def test_tiling_features_say_how_a_block_splits_the_task():
    """A 4096-row task under 128-row tiles: 32 tiles along M (log2 5), no tail; 5000 rows: 40 tiles
    with 120 of the last tile's 128 rows past the end; output programs count the M and N tiles;
    axes the config or the task lacks give nothing."""
    from kernelwright.search.cost_model import make_features, task_feature_fn

    cfg = Config.make("triton.gemm", BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, num_warps=4)
    f = make_features(cfg, {"log2_M": 12.0, "log2_N": 10.0, "log2_K": 12.0, "kind": "gemm"})
    assert f["tiles.M"] == 5.0 and f["tiles.N"] == 4.0 and f["tiles.K"] == 7.0 and f["tiles.out"] == 9.0
    assert f["tail.M"] == 0.0 and "tiles.R" not in f
    g = make_features(cfg, {"log2_M": math.log2(5000), "log2_N": 4.0})
    assert g["tail.M"] == pytest.approx((40 * 128 - 5000) / (40 * 128)) and g["tiles.N"] == 0.0  # a tile wider than N
    assert task_feature_fn({"log2_M": 12.0, "log2_N": 10.0, "log2_K": 12.0, "kind": "gemm"})(cfg) == f
    assert "tiles.out" not in make_features(Config.make("triton.row", num_warps=4), {"log2_M": 12.0})


def test_a_gemm_tiles_shared_memory_and_accumulators_are_features():
    """A GEMM tile's operand tiles in flight, (128 + 256) x 32 x 4 stages elements, and its
    accumulators per thread, 128 x 256 over 8 warps of 32 threads, as log2; not for a convolution
    template's tile, nor for a config without all three block sizes."""
    from kernelwright.search.cost_model import make_features

    cfg = Config.make("triton.gemm_rowreduce", BLOCK_M=128, BLOCK_N=256, BLOCK_K=32, num_stages=4, num_warps=8)
    f = make_features(cfg, {"log2_M": 15.0})
    assert f["tile.smem"] == pytest.approx(math.log2((128 + 256) * 32 * 4))
    assert f["tile.acc"] == pytest.approx(math.log2(128 * 256 / (8 * 32)))
    conv = Config.make("triton.conv", BLOCK_M=128, BLOCK_N=256, BLOCK_K=32, num_stages=4, num_warps=8)
    assert "tile.smem" not in make_features(conv, {"log2_M": 15.0})
    assert "tile.smem" not in make_features(Config.make("triton.gemm", BLOCK_M=128, num_warps=4), {})


def test_a_recurrent_units_dependent_steps():
    import torch

    from kernelwright.capture.export import capture_module
    from kernelwright.search.plan_search import recurrent_steps

    lstm = capture_module(torch.nn.LSTM(4, 8, 2, batch_first=True), [torch.randn(3, 5, 4)])
    gru = capture_module(torch.nn.GRU(4, 8, 3, bidirectional=True), [torch.randn(7, 2, 4)])
    (rnn_lstm,) = [n.name for n in lstm.nodes if n.op == "lstm"]
    (rnn_gru,) = [n.name for n in gru.nodes if n.op == "gru"]
    assert recurrent_steps(lstm, [rnn_lstm], None) == 10  # 5 steps x 2 layers
    assert recurrent_steps(lstm, [rnn_lstm], {"WAVE": True}) == 6  # a wavefront: 5 + 2 - 1
    assert recurrent_steps(gru, [rnn_gru], {"WAVE": False}) == 21  # directions side by side
    assert recurrent_steps(lstm, [n.name for n in lstm.nodes if n.op != "lstm"], None) is None


def test_before_its_model_has_data_model_based_spreads_its_picks():
    """Cold, the model-based strategy's first picks span the space: after a random first pick,
    each is the config farthest from those asked (on one axis of 9 sizes: the second an end of
    it, the first three at least 3 doublings apart whatever the first), and a later ask continues
    from every config asked so far."""
    space = [Config.make("triton.row", BLOCK=2 ** k) for k in range(4, 13)]  # BLOCK 16 .. 4096
    for seed in range(6):
        s = ModelBased(seed=seed).bind(space)
        assert not s.model.fitted
        logs = [int(math.log2(dict(c.params)["BLOCK"])) for c in s.ask(3)]
        assert logs[1] in (4, 12) and min(abs(a - b) for i, a in enumerate(logs) for b in logs[:i]) >= 3, logs
        more = [int(math.log2(dict(c.params)["BLOCK"])) for c in s.ask(2)]
        assert not set(more) & set(logs) and min(abs(a - b) for a in more for b in logs) >= 1


def test_the_analytic_prior_scores_configs_without_measurements():
    """A memory-bound row tile ranks best at about 8 elements per thread, a row that fits the tile
    before one that takes passes, and, given the device's SMs, a grid with fewer programs than SMs
    below one that fills them; a GEMM tile ranks bigger output tiles and a 4-stage pipeline first; a config without
    warps or BLOCK_ sizes scores 0."""
    from kernelwright.search.cost_model import analytic_prior, make_features

    task = {"log2_M": 13.0, "log2_R": 12.0}  # 8192 rows of 4096

    def row(**params):
        return analytic_prior(make_features(Config.make("triton.row", **params), task))

    eight = row(BLOCK_M=1, BLOCK_R=4096, num_warps=16)  # 4096 over 512 threads
    assert eight < row(BLOCK_M=1, BLOCK_R=4096, num_warps=1) and eight < row(BLOCK_M=1, BLOCK_R=512, num_warps=16)
    assert row(BLOCK_M=1, BLOCK_R=4096, num_warps=16) < row(BLOCK_M=1, BLOCK_R=512, num_warps=2)  # 8 passes
    few_rows = make_features(Config.make("triton.row", BLOCK_M=1, BLOCK_R=4096, num_warps=16), {"log2_M": 5.0, "log2_R": 12.0})
    assert analytic_prior(few_rows, sms=132) == pytest.approx(eight + math.log2(132) - 5)  # 32 programs, 132 SMs
    assert analytic_prior(few_rows) == pytest.approx(eight)  # (no device, no count of SMs to fill)
    from kernelwright.search.strategies import choose_strategy
    shipped = choose_strategy(100, 10, sms=132)  # (tune passes its device's count)
    assert shipped.prior(few_rows) == pytest.approx(analytic_prior(few_rows, sms=132))
    gemm = {"log2_M": 13.0, "log2_N": 12.0, "log2_K": 12.0}

    def tile(bm, bn, stages):
        cfg = Config.make("triton.gemm", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32, num_warps=8, num_stages=stages)
        return analytic_prior(make_features(cfg, gemm))

    assert tile(128, 256, 4) < tile(128, 128, 4) < tile(64, 128, 4) and tile(128, 256, 4) < tile(128, 256, 2)
    assert analytic_prior(make_features(Config.make("triton.row", BLOCK=64), task)) == 0.0
    assert analytic_prior(make_features(Config.make("triton.row", num_warps=4), task)) == 0.0


def test_model_based_starts_at_the_priors_pick_and_orders_ties_by_it():
    """Cold, the first pick is the config the prior ranks first (whatever the seed; without a prior
    it is random); once fitted on records that all took the same time (one predicted value for
    every config), picks follow the prior's order, not the candidates'."""
    space = [Config.make("triton.row", BLOCK_R=2 ** k, num_warps=w) for k in range(4, 13) for w in (1, 4, 16)]
    feats = task_feature_fn({"log2_M": 13.0, "log2_R": 12.0})
    prior = lambda f: abs(f["BLOCK_R"] - 10.0) + abs(f["num_warps"] - 2.0)  # noqa: E731 (1024 over 4 warps first)
    best = Config.make("triton.row", BLOCK_R=1024, num_warps=4)
    assert {ModelBased(seed=s, prior=prior).bind(space, feats).ask(1)[0] for s in range(5)} == {best}
    assert len({ModelBased(seed=s, prior=None).bind(space, feats).ask(1)[0] for s in range(8)}) > 1
    s = ModelBased(seed=0, prior=prior, explore=0.0).bind(space[::-1], feats)
    first = s.ask(3)
    s.tell([RunResult(c, 1.0) for c in first])
    assert s.model.fitted
    rest = [c for c in space[::-1] if c not in first]
    by_prior = sorted(rest, key=lambda c: prior(feats(c)))
    got = s.ask(4)
    assert [prior(feats(c)) for c in got] == [prior(feats(c)) for c in by_prior[:4]]


def test_a_cold_search_spreads_its_first_records_over_the_priors_best_quarter():
    """Before the model has data, the picks after the prior's first spread over the quarter of the
    space the prior ranks best (spread_share), not over the whole space; spread_share=1 spreads
    over everything, and a share outside (0, 1] is refused."""
    space = [Config.make("triton.row", BLOCK_R=2 ** k, num_warps=w) for k in range(4, 13) for w in (1, 2, 4, 8, 16)]
    feats = task_feature_fn({"log2_M": 13.0, "log2_R": 12.0})
    prior = lambda f: abs(f["BLOCK_R"] - 10.0) + abs(f["num_warps"] - 2.0)  # noqa: E731
    scores = sorted(prior(feats(c)) for c in space)
    quarter = scores[len(scores) // 4]  # (the rest of the pool's quantile lies at or under it)
    for seed in range(4):
        picks = ModelBased(seed=seed, prior=prior).bind(space, feats).ask(4)
        assert all(prior(feats(c)) <= quarter for c in picks), [prior(feats(c)) for c in picks]
    wide = ModelBased(seed=0, prior=prior, spread_share=1.0).bind(space, feats).ask(4)
    assert max(prior(feats(c)) for c in wide) > quarter  # farthest points reach the space's ends
    with pytest.raises(ValueError, match="spread_share"):
        ModelBased(spread_share=0.0)
