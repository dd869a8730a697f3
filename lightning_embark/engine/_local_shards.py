"""The blocks a rank holds, as checkpoints and initialisation see them.

A :class:`LocalShard` is one block with its global rows, its weights and its sparse
optimizer's state; :func:`local_shards` lists them and :func:`load_local_shards`
overwrites them, both in the clusters' ``local_blocks`` order, which is the order the
checkpoint chunks use. :func:`initial_blocks` gives a fresh model's blocks: copied from
full tables where given, else drawn from a generator seeded per (table, row shard), so
that every replica and column shard of a row shard agrees without any rank
materialising a whole table.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from lightning_embark.engine._routing import TableInfo
from lightning_embark.engine._tables import TableConfig
from lightning_embark.engine.clusters import Cluster
from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class LocalShard:
    """A block this rank holds: global rows ``rows`` x columns ``[col_start, col_end)``."""

    table: str
    replica: int
    row_shard: int
    col_shard: int
    #: Global IDs of the block's rows in local order (on the weights' device).
    rows: torch.Tensor
    col_start: int
    col_end: int
    weight: torch.Tensor
    #: The sparse optimizer's state of the block (``[rows, width]`` Adagrad, ``[rows]``
    #: row-wise Adagrad, None for SGD); row-wise state is the whole row's, so every
    #: column shard of a row holds the same values.
    optimizer_state: torch.Tensor | None = None


def local_shards(clusters: Sequence[Cluster]) -> list[LocalShard]:
    """Every local block of ``clusters``, with its global rows, weights and state."""
    out = []
    for cluster in clusters:
        states = cluster_states(cluster)
        for (block, weight), state in zip(cluster.local_blocks(), states, strict=True):
            table = cluster.routes.tables[block.table]
            out.append(
                LocalShard(
                    table=table.name,
                    replica=block.replica,
                    row_shard=block.row_shard,
                    col_shard=block.col_shard,
                    rows=table.global_rows(block.row_shard, weight.device),
                    col_start=block.col_start,
                    col_end=block.col_end,
                    weight=weight,
                    optimizer_state=state,
                )
            )
    return out


def load_local_shards(
    clusters: Sequence[Cluster],
    weights: Sequence[torch.Tensor],
    states: Sequence[torch.Tensor | None],
) -> None:
    """Overwrite every local block's weights and optimizer state, in :func:`local_shards`
    order (a None state leaves that block's state as it is).

    Raises:
        ConfigError: the counts do not match the blocks this rank holds.
    """
    count = sum(len(c.local_blocks()) for c in clusters)
    if len(weights) != count or len(states) != count:
        raise ConfigError(
            f"this rank holds {count} blocks, got {len(weights)} weights and {len(states)} states"
        )
    start = 0
    for cluster in clusters:
        n = len(cluster.local_blocks())
        load_blocks(cluster, list(weights[start : start + n]))
        for store, indices in cluster.stores():
            store.load_optimizer_state([states[start + i] for i in indices])
        start += n


def full_tables_by_plan_name(
    configs: Sequence[TableConfig],
    tables: Sequence[TableInfo],
    weights: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor | None]:
    """The full initial weights given for each table (``weights`` keyed by plan or config
    name), by plan name; None where none was given.

    Args:
        configs: The engine's table configs, in model order.
        tables: Their plan names and shapes, in the same order.
        weights: Full ``[rows, dim]`` tensors by plan or config name.

    Raises:
        ConfigError: a given tensor is not ``[rows, dim]``.
    """
    by_plan_name: dict[str, torch.Tensor | None] = {}
    for config, table in zip(configs, tables, strict=True):
        full = weights.get(table.name, weights.get(config.name))
        if full is not None and tuple(full.shape) != (table.num_rows, table.dim):
            raise ConfigError(
                f"weights for table {table.name!r} have shape {tuple(full.shape)}, "
                f"expected ({table.num_rows}, {table.dim})"
            )
        by_plan_name[table.name] = full
    return by_plan_name


def initial_blocks(
    cluster: Cluster, full_tables: Mapping[str, torch.Tensor | None], seed: int
) -> list[torch.Tensor]:
    """A fresh model's local blocks of ``cluster``, in ``local_blocks`` order.

    A table of ``full_tables`` (by plan name) is sliced on its own device; a missing one
    (None) is drawn as ``U(-sqrt(1/N), sqrt(1/N))`` for ``N`` rows (torchrec's default
    init) from a CPU generator seeded with ``seed + crc32("table/row_shard")``, on the
    host, so the same seed gives the same weights whatever the engine's device.
    :func:`load_blocks` copies either into the stores, onto the engine's device.
    """
    new = []
    for block, _ in cluster.local_blocks():
        table = cluster.routes.tables[block.table]
        full = full_tables[table.name]
        if full is not None:
            new.append(
                full[
                    table.global_rows(block.row_shard, full.device),
                    block.col_start : block.col_end,
                ].float()
            )
            continue
        generator = torch.Generator(device="cpu").manual_seed(
            seed + zlib.crc32(f"{table.name}/{block.row_shard}".encode())
        )
        bound = (1.0 / table.num_rows) ** 0.5
        rows = torch.empty(block.num_rows, table.dim, device="cpu").uniform_(
            -bound, bound, generator=generator
        )
        new.append(rows[:, block.col_start : block.col_end])
    return new


def cluster_states(cluster: Cluster) -> list[torch.Tensor | None]:
    """Optimizer state per local block of a cluster, in ``local_blocks`` order."""
    out: list[torch.Tensor | None] = [None] * len(cluster.local_blocks())
    for store, indices in cluster.stores():
        for i, state in zip(indices, store.optimizer_state(), strict=True):
            out[i] = state
    return out


def load_blocks(cluster: Cluster, weights: list[torch.Tensor]) -> None:
    """Copy weights (from any device) into a cluster's stores, in ``local_blocks`` order."""
    for (_, dst), src in zip(cluster.local_blocks(), weights, strict=True):
        with torch.no_grad():
            dst.copy_(src)
