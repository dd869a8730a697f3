"""The EMBark engine: executing a sharding plan with embedding clusters.

:class:`ShardedEmbeddingBagCollection` is a drop-in torchrec
``EmbeddingBagCollection`` whose tables live as blocks on the ranks a
:class:`~lightning_embark.plan.Plan` names; each plan cluster (DP / RB / UB,
:mod:`.clusters`) runs one fused exchange per phase, owners look up through a
:mod:`.stores` store and apply the :class:`SparseOptimizer` inside backward.
:class:`ShardedEmbeddingTowerCollection` does the same for torchrec's
``EmbeddingTowerCollection`` (each tower's tables on one host, its interaction
module run there, only its output crossing hosts). :mod:`.chunks` gives a
plan-independent checkpoint layout of the tables and :func:`analytic_bytes` the bytes
a step sends.
"""

from lightning_embark.engine._analytic_bytes import analytic_bytes
from lightning_embark.engine._batch import FeatureBatch, jagged_by_key
from lightning_embark.engine._chunks import (
    Chunk,
    TableChunks,
    apply_chunks,
    load_targets,
    save_chunks,
    state_size,
)
from lightning_embark.engine._link_bytes import LinkBytes, StepBytes
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._routing import TableInfo
from lightning_embark.engine._sharded import LocalShard, ShardedEmbeddingBagCollection
from lightning_embark.engine._tower_collection import (
    KeyedInteraction,
    ShardedEmbeddingTowerCollection,
    output_width,
    tower_tables,
)

__all__ = [
    "Chunk",
    "FeatureBatch",
    "KeyedInteraction",
    "LinkBytes",
    "LocalShard",
    "OptimizerKind",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingTowerCollection",
    "SparseOptimizer",
    "StepBytes",
    "TableChunks",
    "TableInfo",
    "analytic_bytes",
    "apply_chunks",
    "jagged_by_key",
    "load_targets",
    "output_width",
    "save_chunks",
    "state_size",
    "tower_tables",
]
