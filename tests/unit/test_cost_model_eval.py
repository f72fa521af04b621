"""Offline leave-one-problem-out evaluation of the cost model (search/evaluate.py)."""
import math
import random

import pytest

from kernelwright.search.evaluate import held_out_tasks, learning_curve, problem_of
from kernelwright.space.config import Config


def _records(n_problems=6, seed=0):
    """Trials of one template on several problems whose time follows one law of the config and the
    problem's size: a block of 2**(size-12) elements with 4 warps per 64 columns is fastest."""
    rng = random.Random(seed)
    out = []
    for p in range(n_problems):
        size = 14 + p % 4
        for block in (16, 32, 64, 128, 256, 512):
            for warps in (1, 2, 4, 8):
                best_block = 2 ** (size - 12)
                t = (1 + abs(math.log2(block / best_block))) * (1 + 0.3 * abs(math.log2(warps / max(1, block // 64) or 1)))
                cfg = Config("triton.row", {"BLOCK": block, "num_warps": warps})
                out.append({"task_key": f"prob{p}/g0/{size}", "task_features": {"log2_numel": size},
                            "template": "triton.row", "config": cfg.to_dict(), "device": "H200",
                            "precision": "fp32", "error": None,
                            "time_ms": t * (1 + 0.02 * rng.random())})
    return out


def test_more_training_records_rank_unseen_problems_better():
    curve = learning_curve(_records(), [0, 20, 10_000], seed=0)
    chance, few, full = curve
    assert chance.n_train == 0 and chance.train_mean == 0 and full.train_mean == 5 * 24
    assert chance.tasks == few.tasks == full.tasks == 6
    assert full.rho > 0.8 > chance.rho
    assert full.regret1 < chance.regret1 and full.regret1 < 1.3
    assert full.regret3 <= full.regret1


def test_held_out_tasks_merge_repeats_and_skip_failures():
    recs = _records(n_problems=1)
    repeat = dict(recs[0], time_ms=recs[0]["time_ms"] * 3)
    failed = dict(recs[1], error="compile error", time_ms=None)
    (task,) = held_out_tasks(("H200", "fp32", "triton.row"), recs + [repeat, failed], min_configs=6)
    assert problem_of(task.task_key) == "prob0" and len(task.times) == 24
    assert recs[0]["time_ms"] * 2 in task.times  # the median of the two measurements


def test_too_few_problems_is_an_error():
    with pytest.raises(ValueError, match="no task to hold out"):
        learning_curve(_records(n_problems=2), [0, 100])
