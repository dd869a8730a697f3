"""The EMBark engine: executing a sharding plan with embedding clusters, without torchrec.

:class:`EmbeddingEngine` holds tables as blocks on the ranks a
:class:`~lightning_embark.plan.Plan` names and looks up a rank's local batch, given as
jagged IDs per feature (:class:`FeatureBatch`); each plan cluster (DP / RB / UB,
:mod:`.clusters`) runs one fused exchange per phase, owners look up through a
:mod:`.stores` store and apply the :class:`SparseOptimizer` inside backward; a plan's
towers run on their hosts with their tower modules (:class:`ProjectionTower`,
:class:`DCNTower`). :mod:`.chunks` gives a plan-independent checkpoint layout of the
tables and :func:`analytic_bytes` the bytes a step sends.

Nothing here imports torchrec or fbgemm (fbgemm's kernels are used where they load):
torchrec's module types, which users see, are :mod:`lightning_embark.torchrec_modules`.
"""

from lightning_embark.engine._analytic_bytes import analytic_bytes
from lightning_embark.engine._batch import FeatureBatch, jagged_by_key, jagged_of
from lightning_embark.engine._checks import checked_jagged
from lightning_embark.engine._chunks import (
    Chunk,
    TableChunks,
    apply_chunks,
    load_targets,
    save_chunks,
    state_size,
)
from lightning_embark.engine._config import EngineConfig
from lightning_embark.engine._engine import EmbeddingEngine
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._link_bytes import LinkBytes, StepBytes
from lightning_embark.engine._local_shards import LocalShard
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._placement import (
    STORES,
    EnginePlacement,
    engine_placement,
    placement_store,
)
from lightning_embark.engine._routing import TableInfo
from lightning_embark.engine._tables import POOLINGS, TableConfig, table_config
from lightning_embark.engine._tower_modules import (
    DCNTower,
    DotTower,
    ProjectionTower,
    tower_module,
)

__all__ = [
    "POOLINGS",
    "STORES",
    "Chunk",
    "DCNTower",
    "DotTower",
    "EmbeddingEngine",
    "EngineConfig",
    "EnginePlacement",
    "FeatureBatch",
    "JaggedBatch",
    "LinkBytes",
    "LocalShard",
    "OptimizerKind",
    "ProjectionTower",
    "SparseOptimizer",
    "StepBytes",
    "TableChunks",
    "TableConfig",
    "TableInfo",
    "analytic_bytes",
    "apply_chunks",
    "checked_jagged",
    "engine_placement",
    "jagged_by_key",
    "jagged_of",
    "load_targets",
    "placement_store",
    "save_chunks",
    "state_size",
    "table_config",
    "tower_module",
]
