"""Hyper-parameters of :class:`~lightning_embark.models.DLRMModule`.

Defaults follow the MLPerf DLRM-DCNv2 reference (dense arch 512-256-D, over arch
1024-1024-512-256-1, three low-rank-512 cross layers, Adagrad and row-wise Adagrad
at learning rate 0.005, eps 1e-8), so that a baseline built without arguments is a
well-configured torchrec model rather than a toy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_embark.errors import ConfigError
from lightning_embark.models._optimizers import (
    DENSE_OPTIMIZERS,
    SPARSE_OPTIMIZERS,
    DenseOptimizerSpec,
    SparseOptimizerSpec,
)

INTERACTIONS = ("dot", "dcn")


def _layer_sizes(name: str, value: Sequence[int] | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    sizes = tuple(value)
    if not sizes or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ConfigError(
            f"DLRMConfig.{name} must be a non-empty list of positive ints, got {value!r}"
        )
    return sizes


@dataclass(frozen=True, kw_only=True)
class DLRMConfig:
    """Architecture and optimizer settings of a DLRM / DLRM-DCNv2 model.

    Attributes:
        dense_arch_layer_sizes: Bottom MLP widths; the last must equal the tables'
            embedding dim. None: ``(512, 256, embedding_dim)``.
        over_arch_layer_sizes: Top MLP widths; the last must be 1 (the logit).
        interaction: ``"dot"`` (DLRM pairwise dot products) or ``"dcn"`` (DCNv2
            low-rank cross network).
        dcn_num_layers: Cross layers (``"dcn"`` only).
        dcn_low_rank_dim: Rank of each cross layer's weight (``"dcn"`` only).
        dense_optimizer: ``"adagrad"`` (MLPerf) or ``"adam"``, for every non-embedding
            parameter.
        dense_lr: Dense learning rate.
        sparse_optimizer: ``"rowwise_adagrad"`` (MLPerf), ``"adagrad"`` or ``"sgd"``,
            for the embedding tables (fused into the TBE backward when sharded).
        sparse_lr: Embedding learning rate.
        eps: Adagrad/Adam epsilon, dense and sparse.
        towers: A ``towers.json`` (``embark-plan --towers ... --towers-out`` or written by
            hand): DMT towers, each a group of tables whose module's output the
            interaction reads instead of their pooled vectors (:mod:`._tower_dlrm`).
            None: a flat DLRM (torchrec's own ``DLRM`` / ``DLRM_DCN``).
    """

    dense_arch_layer_sizes: tuple[int, ...] | None = None
    over_arch_layer_sizes: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    interaction: str = "dot"
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512
    dense_optimizer: str = "adagrad"
    dense_lr: float = 0.005
    sparse_optimizer: str = "rowwise_adagrad"
    sparse_lr: float = 0.005
    eps: float = 1e-8
    towers: str | None = None

    def __post_init__(self) -> None:
        # Lists are accepted for convenience and stored as tuples (the config is frozen).
        object.__setattr__(
            self,
            "dense_arch_layer_sizes",
            _layer_sizes("dense_arch_layer_sizes", self.dense_arch_layer_sizes),
        )
        over = _layer_sizes("over_arch_layer_sizes", self.over_arch_layer_sizes)
        object.__setattr__(self, "over_arch_layer_sizes", over)
        if over is not None and over[-1] != 1:
            raise ConfigError(
                f"DLRMConfig.over_arch_layer_sizes must end with 1 (the logit), got {over!r}"
            )
        if self.interaction not in INTERACTIONS:
            raise ConfigError(
                f"DLRMConfig.interaction must be one of {INTERACTIONS}, got {self.interaction!r}"
            )
        for field in ("dcn_num_layers", "dcn_low_rank_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"DLRMConfig.{field} must be a positive integer, got {value!r}")
        if self.dense_optimizer not in DENSE_OPTIMIZERS:
            raise ConfigError(
                f"DLRMConfig.dense_optimizer must be one of {sorted(DENSE_OPTIMIZERS)}, "
                f"got {self.dense_optimizer!r}"
            )
        if self.sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise ConfigError(
                f"DLRMConfig.sparse_optimizer must be one of {sorted(SPARSE_OPTIMIZERS)}, "
                f"got {self.sparse_optimizer!r}"
            )
        # Validates the rates and eps with the optimizer named in the message.
        self.dense_optimizer_spec()
        self.sparse_optimizer_spec()

    def dense_layers(self, embedding_dim: int) -> tuple[int, ...]:
        """Bottom MLP widths for tables of width ``embedding_dim``.

        Raises:
            ConfigError: the configured last width differs from ``embedding_dim``
                (DLRM concatenates the bottom MLP output with the embeddings).
        """
        sizes = self.dense_arch_layer_sizes or (512, 256, embedding_dim)
        if sizes[-1] != embedding_dim:
            raise ConfigError(
                f"DLRMConfig.dense_arch_layer_sizes must end with the embedding dim "
                f"{embedding_dim}, got {sizes!r}"
            )
        return sizes

    def dense_optimizer_spec(self) -> DenseOptimizerSpec:
        """The dense optimizer described by this config."""
        return DenseOptimizerSpec(kind=self.dense_optimizer, lr=self.dense_lr, eps=self.eps)

    def sparse_optimizer_spec(self) -> SparseOptimizerSpec:
        """The embedding optimizer described by this config."""
        return SparseOptimizerSpec(kind=self.sparse_optimizer, lr=self.sparse_lr, eps=self.eps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for hyper-parameter logging)."""
        return dataclasses.asdict(self)
