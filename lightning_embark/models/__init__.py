"""Recommendation models as LightningModules, shardable by the project's strategies."""

from lightning_embark.models.dlrm import EMBEDDING_PATH, DLRMModule
from lightning_embark.models.dlrm_config import DLRMConfig
from lightning_embark.models.optimizers import (
    ChainedOptimizer,
    DenseOptimizerSpec,
    SparseOptimizerSpec,
)
from lightning_embark.models.protocol import ShardableModule

__all__ = [
    "EMBEDDING_PATH",
    "ChainedOptimizer",
    "DLRMConfig",
    "DLRMModule",
    "DenseOptimizerSpec",
    "ShardableModule",
    "SparseOptimizerSpec",
]
