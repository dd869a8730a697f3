"""Sharding a LightningModule with the EMBark engine: pure steps the strategy composes.

* :mod:`.options`: :class:`EmbarkOptions`, validated when the strategy is built.
* :mod:`.discovery`: the module's torchrec collections and what a batch says of them.
* :mod:`.planning`: the automatic plan (greedy or torchrec's planner), agreed on by
  every rank.
* :mod:`.compose`: the ordered steps (discover, plan, agree, shard, scale) as one function.
* :mod:`.dense_allreduce`: the dense-gradient all-reduce hook (hierarchical, compressed).
* :mod:`.checkpoint`: sharded checkpoints that load under any plan.
* :mod:`.metrics`: per-step bytes and timings as Lightning metrics.
"""

from lightning_embark.sharding.checkpoint import export_tables, read_tables
from lightning_embark.sharding.compose import ShardedModule, engine_optimizer, shard_module
from lightning_embark.sharding.discovery import (
    TableStats,
    find_embedding_collections,
    find_sparse_features,
    sample_stats,
    spec_of,
    table_configs,
)
from lightning_embark.sharding.metrics import EmbarkMetricsCallback
from lightning_embark.sharding.options import EmbarkOptions
from lightning_embark.sharding.planning import (
    agree_on_plan,
    automatic_plan,
    check_allow,
    load_plan,
    torchrec_planner_plan,
    validate_plan,
)

__all__ = [
    "EmbarkMetricsCallback",
    "EmbarkOptions",
    "ShardedModule",
    "TableStats",
    "agree_on_plan",
    "automatic_plan",
    "check_allow",
    "engine_optimizer",
    "export_tables",
    "find_embedding_collections",
    "find_sparse_features",
    "load_plan",
    "read_tables",
    "sample_stats",
    "shard_module",
    "spec_of",
    "table_configs",
    "torchrec_planner_plan",
    "validate_plan",
]
