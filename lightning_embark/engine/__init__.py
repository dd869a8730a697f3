"""The EMBark engine: executing a sharding plan with embedding clusters.

:class:`ShardedEmbeddingBagCollection` is a drop-in torchrec
``EmbeddingBagCollection`` whose tables live as blocks on the ranks a
:class:`~lightning_embark.plan.Plan` names; each plan cluster (DP / RB / UB,
:mod:`.clusters`) runs one fused exchange per phase, owners look up through a
:mod:`.stores` store and apply the :class:`SparseOptimizer` inside backward.
:mod:`.chunks` gives a plan-independent checkpoint layout of the tables and
:func:`analytic_bytes` the bytes a step sends.
"""

from lightning_embark.engine._analytic_bytes import LinkBytes, StepBytes, analytic_bytes
from lightning_embark.engine._batch import FeatureBatch, jagged_by_key
from lightning_embark.engine._chunks import (
    Chunk,
    TableChunks,
    apply_chunks,
    load_targets,
    save_chunks,
    state_size,
)
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._routing import TableInfo
from lightning_embark.engine._sharded import LocalShard, ShardedEmbeddingBagCollection

__all__ = [
    "Chunk",
    "FeatureBatch",
    "LinkBytes",
    "LocalShard",
    "OptimizerKind",
    "ShardedEmbeddingBagCollection",
    "SparseOptimizer",
    "StepBytes",
    "TableChunks",
    "TableInfo",
    "analytic_bytes",
    "apply_chunks",
    "jagged_by_key",
    "load_targets",
    "save_chunks",
    "state_size",
]
