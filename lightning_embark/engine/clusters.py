"""Embedding clusters: the plug point that turns a local batch into pooled vectors.

A :class:`Cluster` owns the blocks this rank holds for one cluster of the plan and
runs the cluster's exchange in forward (pooled vectors for the local batch) and in
backward (gradients to the owners, then the sparse optimizer). The sharded module
calls every cluster in plan order inside one autograd node, so every rank issues
the same collectives in the same order in forward and in backward.

* :class:`DPCluster` (here): every rank holds whole tables; lookup is local and the
  backward all-reduces one flat buffer of dense gradients for all the cluster's tables.
* ``RBCluster`` / ``UBCluster`` (``rb.py`` / ``ub.py``): reduction- and unique-based
  exchanges on top of :class:`lightning_embark.engine.exchanged.ExchangedCluster`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine.lookup import Bags, ShardStore, SparseOptimizer, make_store, row_grads
from lightning_embark.engine.plan import ClusterType
from lightning_embark.engine.routing import ClusterRoutes
from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class FeatureBatch:
    """One feature of the local batch: IDs, bag lengths (one per sample), optional weights."""

    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.lengths.numel()

    def offsets(self) -> torch.Tensor:
        return torch.cat([torch.zeros(1, dtype=torch.int64), self.lengths.to(torch.int64).cumsum(0)])

    def bag_of(self) -> torch.Tensor:
        """The sample index of every ID."""
        return torch.repeat_interleave(torch.arange(self.batch_size), self.lengths.to(torch.int64))


def jagged_by_key(features: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """``(values, lengths, weights)`` per key of a KJT; unlike ``KJT.to_dict`` it accepts 0 samples."""
    keys = features.keys()
    lengths = features.lengths().reshape(len(keys), features.stride())
    per_key = lengths.sum(1).tolist()
    values = torch.split(features.values(), per_key)
    weights = features.weights_or_none()
    split_weights = torch.split(weights, per_key) if weights is not None else [None] * len(keys)
    return {k: (v, n, w) for k, v, n, w in zip(keys, values, lengths, split_weights, strict=True)}


def mean_scale(batch: FeatureBatch) -> torch.Tensor:
    """``1 / max(length, 1)`` per sample, as a column: mean pooling of empty bags gives 0."""
    return 1.0 / batch.lengths.clamp_min(1).to(torch.float32).unsqueeze(1)


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """Execution options shared by every cluster of a sharded module.

    Attributes:
        optimizer: The sparse optimizer applied at the owners.
        kernel: ``"auto"`` (fbgemm where it works), ``"fbgemm"`` or ``"torch"``.
        group: Process group the plan's ranks index (None: the default group).
        ranks_per_host: Ranks per host of the plan (hierarchical exchanges).
        weighted: Whether features carry per-sample weights (KJT weights).
    """

    optimizer: SparseOptimizer
    kernel: str = "auto"
    group: Any = None
    ranks_per_host: int = 1
    weighted: bool = False


class Cluster(ABC):
    """One embedding cluster executed on this rank."""

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        self.routes = routes
        self.rank = rank
        self.options = options
        self.name = routes.cluster.name
        self.nonfinite = 0  # non-finite values met by this rank's encoders (see ShardedEmbeddingBagCollection)

    @property
    def exchanges(self) -> bool:
        """Whether forward communicates (and can so carry a batch-validation status)."""
        return True

    @abstractmethod
    def forward(
        self, batch: list[FeatureBatch], *, keep_for_backward: bool, error: ConfigError | None = None
    ) -> tuple[list[torch.Tensor], Any]:
        """Pooled ``[B, d]`` per feature of the cluster, and a context for :meth:`backward`.

        ``error`` is a local batch-validation failure: the cluster still takes part in
        its first collective (so peers are not left waiting), tells them, and raises.
        """

    @abstractmethod
    def backward(self, ctx: Any, grads: list[torch.Tensor]) -> None:
        """Exchange the features' pooled gradients and update the owned rows."""

    @abstractmethod
    def local_blocks(self) -> list[tuple[Any, torch.Tensor]]:
        """``(block, weights)`` for every block this rank holds."""


class DPCluster(Cluster):
    """Data-parallel tables: local lookup, dense gradients all-reduced in one buffer."""

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        self.blocks = routes.blocks[rank]
        for t, table in enumerate(routes.tables):
            ranks = table.layout.ranks
            if table.layout.num_replicas != routes.world_size or any(ranks[g][0] != g for g in range(len(ranks))):
                raise ConfigError(
                    f"table {table.name!r} is in DP cluster {self.name!r} but replica g is not on rank g "
                    f"(ranks {ranks}); a DP table needs ranks=[[0], [1], ..., [{routes.world_size - 1}]]"
                )
        order = {b.table: i for i, b in enumerate(self.blocks)}
        self._local = [order[t] for t in range(len(routes.tables))]
        self.store: ShardStore = make_store(
            options.kernel, [(b.num_rows, b.width) for b in self.blocks], options.optimizer
        )

    @property
    def exchanges(self) -> bool:
        return False

    def _bags(self, batch: list[FeatureBatch]) -> list[Bags]:
        per_table: list[list[FeatureBatch]] = [[] for _ in self.blocks]
        for f, fb in enumerate(batch):
            per_table[self._local[self.routes.feature_table[f]]].append(fb)
        bags = []
        for fbs in per_table:
            offsets = [torch.zeros(1, dtype=torch.int64)]
            for fb in fbs:
                offsets.append(fb.lengths.to(torch.int64).cumsum(0) + offsets[-1][-1])
            weights = [fb.weights for fb in fbs if fb.weights is not None]
            bags.append(
                Bags(
                    indices=torch.cat([fb.values.to(torch.int64) for fb in fbs] or [torch.zeros(0, dtype=torch.int64)]),
                    offsets=torch.cat(offsets),
                    weights=torch.cat(weights) if weights else None,
                )
            )
        return bags

    def forward(
        self, batch: list[FeatureBatch], *, keep_for_backward: bool, error: ConfigError | None = None
    ) -> tuple[list[torch.Tensor], Any]:
        if error is not None:
            raise error
        bags = self._bags(batch)
        pooled, _ = self.store.pooled(bags, keep_for_backward=False)
        out, cursor = [], [0] * len(bags)
        for f, fb in enumerate(batch):
            local = self._local[self.routes.feature_table[f]]
            piece = pooled[local][cursor[local] : cursor[local] + fb.batch_size]
            cursor[local] += fb.batch_size
            if self.routes.features[f].pooling == "mean":
                piece = piece * mean_scale(fb)
            out.append(piece)
        return out, (bags, batch)

    def backward(self, ctx: Any, grads: list[torch.Tensor]) -> None:
        bags, batch = ctx
        pooled_grads: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for f, (fb, g) in enumerate(zip(batch, grads, strict=True)):
            if self.routes.features[f].pooling == "mean":
                g = g * mean_scale(fb)
            pooled_grads[self._local[self.routes.feature_table[f]]].append(g)
        dense = []
        for block, b, gs in zip(self.blocks, bags, pooled_grads, strict=True):
            rows, summed = row_grads(b, torch.cat(gs) if gs else torch.zeros(0, block.width))
            dense.append(torch.zeros(block.num_rows, block.width).index_add_(0, rows, summed))
        flat = torch.cat([d.reshape(-1) for d in dense])
        dist.all_reduce(flat, group=self.options.group)
        rows, updates, start = [], [], 0
        for d in dense:
            full = flat[start : start + d.numel()].reshape(d.shape)
            start += d.numel()
            touched = full.ne(0).any(1).nonzero().flatten()
            rows.append(touched)
            updates.append(full[touched])
        self.store.apply_row_grads(rows, updates)

    def local_blocks(self) -> list[tuple[Any, torch.Tensor]]:
        return list(zip(self.blocks, self.store.weights(), strict=True))


def make_cluster(routes: ClusterRoutes, rank: int, options: EngineOptions) -> Cluster:
    """The cluster implementation for the plan's cluster type."""
    from lightning_embark.engine.rb import RBCluster
    from lightning_embark.engine.ub import UBCluster

    kinds: dict[ClusterType, type[Cluster]] = {
        ClusterType.DP: DPCluster,
        ClusterType.RB: RBCluster,
        ClusterType.UB: UBCluster,
    }
    return kinds[routes.cluster.type](routes, rank, options)
