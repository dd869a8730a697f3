"""`Trainer(strategy="embark")`: the Lightning strategy over the EMBark engine.

``import lightning_embark`` registers ``strategy="embark"`` with Lightning's
``StrategyRegistry`` (Lightning has no entry-point discovery for strategies);
``EmbarkStrategy(plan=..., allow=...)`` gives the options explicitly.
"""

from __future__ import annotations

from lightning_embark.strategy.checkpoint import export_tables, read_tables
from lightning_embark.strategy.config import EmbarkOptions
from lightning_embark.strategy.discovery import (
    TableStats,
    find_embedding_collections,
    find_sparse_features,
    planned_name,
    sample_stats,
    spec_of,
    table_configs,
)
from lightning_embark.strategy.metrics import EmbarkMetricsCallback
from lightning_embark.strategy.planning import (
    agree_on_plan,
    automatic_plan,
    check_allow,
    load_plan,
    plan_summary,
    torchrec_planner_plan,
    validate_plan,
)
from lightning_embark.strategy.sharding import check_trainer_options, engine_optimizer
from lightning_embark.strategy.strategy import EmbarkStrategy

__all__ = [
    "EmbarkMetricsCallback",
    "EmbarkOptions",
    "EmbarkStrategy",
    "TableStats",
    "agree_on_plan",
    "automatic_plan",
    "check_allow",
    "check_trainer_options",
    "engine_optimizer",
    "export_tables",
    "find_embedding_collections",
    "find_sparse_features",
    "load_plan",
    "plan_summary",
    "planned_name",
    "read_tables",
    "sample_stats",
    "spec_of",
    "table_configs",
    "torchrec_planner_plan",
    "validate_plan",
]
