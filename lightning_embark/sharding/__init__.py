"""Sharding a LightningModule with the EMBark engine: pure steps the strategy composes.

* :mod:`.options`: :class:`EmbarkOptions`, validated when the strategy is built.
* :mod:`.discovery`: the module's torchrec collections and what a batch says of them.
* :mod:`.planning`: the automatic plan (greedy or torchrec's planner), agreed on by
  every rank.
* :mod:`.compose`: the ordered steps (discover, plan, agree, shard, scale) as one function.
* :mod:`.placement`: the engine's device, backend and store on a rank (gloo on CPU,
  NCCL on GPUs), chosen apart from the launch.
* :mod:`.prefetch`: the input pipeline's dataloader, each training batch's IDs sent
  while the step before computes.
* :mod:`.dense_allreduce`: the dense-gradient all-reduce hook (hierarchical, compressed).
* :mod:`.checkpoint`: sharded checkpoints that load under any plan.
* :mod:`.export`: a trained model as one unsharded ``state_dict`` file for serving, and
  :class:`EmbarkCheckpointIO`, which lets a plain ``Trainer`` read a checkpoint directory.
* :mod:`.metrics`: per-step bytes and timings as Lightning metrics.
* :mod:`.model_summary`: Lightning's model summary with the sharded tables counted.
* :mod:`.callbacks`: the callbacks the strategy adds to its trainer (metrics, summary).
"""

from lightning_embark.engine import EnginePlacement, engine_placement
from lightning_embark.sharding._callbacks import with_embark_callbacks
from lightning_embark.sharding._checkpoint import load_sharded, save_sharded
from lightning_embark.sharding._checkpoint_io import EmbarkCheckpointIO
from lightning_embark.sharding._compose import (
    ModuleSharding,
    engine_optimizer,
    release_sharded,
    shard_module,
)
from lightning_embark.sharding._dense_allreduce import (
    DENSE_DDP_DEFAULTS,
    DENSE_EXCHANGES,
    default_dense_compression,
    dense_allreduce_state,
    hierarchical_allreduce,
    hierarchical_allreduce_hook,
    release_dense_state,
)
from lightning_embark.sharding._discovery import (
    TableStats,
    find_embedding_collections,
    find_sparse_features,
    sample_stats,
    spec_of,
    table_configs,
)
from lightning_embark.sharding._export import (
    export_model,
    export_sharded,
    export_tables,
    load_exported,
    read_model,
    read_tables,
)
from lightning_embark.sharding._metrics import EmbarkMetricsCallback
from lightning_embark.sharding._model_summary import (
    EmbarkModelSummary,
    EmbarkRichModelSummary,
    TableCountingSummary,
    table_parameters,
)
from lightning_embark.sharding._options import EmbarkOptions
from lightning_embark.sharding._planning import (
    agree_on_plan,
    automatic_plan,
    check_allow,
    load_plan,
    planned_sparse_optimizer,
    planning_model,
    torchrec_planner_plan,
    validate_plan,
)
from lightning_embark.sharding._prefetch import PrefetchingLoader, prefetch_batch

__all__ = [
    "DENSE_DDP_DEFAULTS",
    "DENSE_EXCHANGES",
    "EmbarkCheckpointIO",
    "EmbarkMetricsCallback",
    "EmbarkModelSummary",
    "EmbarkOptions",
    "EmbarkRichModelSummary",
    "EnginePlacement",
    "ModuleSharding",
    "PrefetchingLoader",
    "TableCountingSummary",
    "TableStats",
    "agree_on_plan",
    "automatic_plan",
    "check_allow",
    "default_dense_compression",
    "dense_allreduce_state",
    "engine_optimizer",
    "engine_placement",
    "export_model",
    "export_sharded",
    "export_tables",
    "find_embedding_collections",
    "find_sparse_features",
    "hierarchical_allreduce",
    "hierarchical_allreduce_hook",
    "load_exported",
    "load_plan",
    "load_sharded",
    "planned_sparse_optimizer",
    "planning_model",
    "prefetch_batch",
    "read_model",
    "read_tables",
    "release_dense_state",
    "release_sharded",
    "sample_stats",
    "save_sharded",
    "shard_module",
    "spec_of",
    "table_configs",
    "table_parameters",
    "torchrec_planner_plan",
    "validate_plan",
    "with_embark_callbacks",
]
