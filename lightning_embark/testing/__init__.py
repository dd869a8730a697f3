"""What tests and benchmarks share: gloo ranks on one CPU machine, the unsharded oracle,
small scenarios that put every layout into one plan, a quiet CPU Trainer and a callback
that records its losses."""

from lightning_embark.testing._callbacks import LossRecorder
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import free_port, load_module, rank_context, run_gloo_ranks
from lightning_embark.testing._scenarios import (
    TINY_BENCH_ARGS,
    Scenario,
    all_layouts_plan,
    concat_batches,
    random_batches,
)
from lightning_embark.testing._trainers import QUIET_TRAINER_DEFAULTS, quiet_trainer

__all__ = [
    "QUIET_TRAINER_DEFAULTS",
    "TINY_BENCH_ARGS",
    "LossRecorder",
    "ReferenceOptimizer",
    "Scenario",
    "all_layouts_plan",
    "concat_batches",
    "free_port",
    "load_module",
    "quiet_trainer",
    "random_batches",
    "rank_context",
    "run_gloo_ranks",
]
