"""Search: ask/tell strategies, a learned cost model, the trial database, the tuning loop."""
from .cost_model import (CostModel, Sample, config_features, make_features, record_sample,
                         task_feature_fn)
from .database import TrialDB, default_db_path, make_record, packaged_priors, record_result
from .result import COMPILE, CRASH, ERROR_KINDS, TIMEOUT, WRONG, RunResult
from .strategies import Exhaustive, ModelBased, RandomSearch, Strategy, choose_strategy
from .tune import CandidateCache, TuneResult, tune

__all__ = [
    "CandidateCache", "COMPILE", "CRASH", "CostModel", "ERROR_KINDS", "Exhaustive",
    "ModelBased", "RandomSearch", "RunResult", "Sample", "Strategy", "TIMEOUT", "TrialDB",
    "TuneResult", "WRONG", "choose_strategy", "config_features", "default_db_path",
    "make_features", "make_record", "packaged_priors", "record_result", "record_sample", "task_feature_fn",
    "tune",
]
