"""Recommendation models as LightningModules, shardable by the project's strategies."""

from lightning_embark.engine import DCNTower, DotTower, ProjectionTower, tower_module
from lightning_embark.models._dlrm import EMBEDDING_PATH, DLRMModule
from lightning_embark.models._dlrm_config import DLRMConfig
from lightning_embark.models._optimizers import (
    ChainedOptimizer,
    DenseOptimizerSpec,
    SparseOptimizerSpec,
)
from lightning_embark.models._protocol import ShardableModule

__all__ = [
    "EMBEDDING_PATH",
    "ChainedOptimizer",
    "DCNTower",
    "DLRMConfig",
    "DLRMModule",
    "DenseOptimizerSpec",
    "DotTower",
    "ProjectionTower",
    "ShardableModule",
    "SparseOptimizerSpec",
    "tower_module",
]
