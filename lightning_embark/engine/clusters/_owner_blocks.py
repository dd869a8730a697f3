"""An owner's blocks of a remote (RB or UB) cluster: which update fused, which synced.

Most blocks take the table-batched kernel's fused update straight from their gradient.
Two kinds cannot, because their update needs data from other ranks first
(:mod:`._grad_sync`): blocks of replicated tables (``r > 1``) add their copies' row
gradients, and, under row-wise Adagrad, column-split blocks gather each row's sum of
squares from their column peers. :func:`owner_blocks` sorts a rank's blocks so, and
:func:`update_synced` runs the synced ones' update: row gradients, the syncs, then the
store's update of the rows; :func:`answer_layout` says where each request's answer lies
in the stores' output, the fused store's blocks and the synced store's side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_embark.engine._routing import Block, ClusterRoutes
from lightning_embark.engine.clusters._grad_sync import column_sync, replica_sync
from lightning_embark.engine.stores import FlatBags, ShardStore, row_grads
from lightning_embark.exchange import AllToAll
from lightning_embark.kernels import ExchangeLayout, RankSlice


@dataclass(frozen=True, kw_only=True)
class OwnerBlocks:
    """A rank's blocks of one cluster, sorted by how they update.

    Attributes:
        blocks: The blocks, in the routes' order (their local indices index this).
        replicated: Local indices of blocks of replicated tables.
        column_split: Local indices of column-split blocks that sync their row-wise
            Adagrad state (empty under other optimizers).
        synced: The blocks whose update needs data from other ranks, sorted.
        fused: The rest, which the kernel updates in its backward.
        has_sync: Whether any table of the cluster is replicated (every rank of it then
            takes part in the replica exchange, blocks of its own or not).
        has_column_sync: Likewise for the column sync.
        columns: Each block's first column in the stores' output (the fused store's
            blocks, then the synced store's, side by side).
        width: The stores' output's width.
    """

    blocks: list[Block]
    replicated: list[int]
    column_split: list[int]
    synced: list[int]
    fused: list[int]
    has_sync: bool
    has_column_sync: bool
    columns: dict[int, int]
    width: int


def owner_blocks(routes: ClusterRoutes, rank: int, *, rowwise: bool) -> OwnerBlocks:
    """``rank``'s blocks of the cluster ``routes`` describe, sorted by how they update
    (``rowwise``: the optimizer is row-wise Adagrad)."""
    blocks = routes.blocks[rank]
    replicated = [
        i for i, b in enumerate(blocks) if routes.tables[b.table].layout.num_replicas > 1
    ]
    column_split = [
        i
        for i, b in enumerate(blocks)
        if rowwise and routes.tables[b.table].layout.num_col_shards > 1
    ]
    synced = sorted(set(replicated) | set(column_split))
    fused = [i for i in range(len(blocks)) if i not in synced]
    columns, width = {}, 0
    for local in (*fused, *synced):
        columns[local] = width
        width += blocks[local].width
    return OwnerBlocks(
        blocks=blocks,
        replicated=replicated,
        column_split=column_split,
        synced=synced,
        fused=fused,
        has_sync=any(t.layout.num_replicas > 1 for t in routes.tables),
        has_column_sync=rowwise and any(t.layout.num_col_shards > 1 for t in routes.tables),
        columns=columns,
        width=width,
    )


def answer_layout(
    owned: OwnerBlocks,
    incoming: list[list[int]],
    rows: list[list[int]],
    starts: dict[tuple[int, int], int],
) -> ExchangeLayout:
    """Where each request's answer lies in the stores' output ``[batch, owned.width]``:
    per requester ``q``, one slice per request ``r`` (``rows[q][r]`` rows from
    ``starts[(q, r)]``, the columns of its block ``incoming[q][r]``), in send order."""
    ranks = []
    for q, blocks in enumerate(incoming):
        parts = []
        for r, local in enumerate(blocks):
            first = starts[(q, r)]
            parts.append(
                RankSlice(
                    row_start=first,
                    row_stop=first + rows[q][r],
                    blocks=((owned.columns[local], owned.blocks[local].width),),
                )
            )
        ranks.append(tuple(parts))
    num_rows = max(1, max((p.row_stop for parts in ranks for p in parts), default=0))
    return ExchangeLayout(ranks=ranks, num_rows=num_rows, num_cols=max(1, owned.width))


def update_synced(
    owned: OwnerBlocks,
    store: ShardStore,
    bags: FlatBags,
    grad: torch.Tensor,
    *,
    routes: ClusterRoutes,
    rank: int,
    exchange: AllToAll,
    device: torch.device,
) -> None:
    """Update the synced blocks in ``store`` from ``grad``, the gradient of their bags'
    pooled output (``[bags.batch, sum of their widths]``, blocks side by side in
    :attr:`OwnerBlocks.synced` order): each block's row gradients, summed over its
    replicas, with the row-wise state's column sum of squares, then one update."""
    grads, start = [], 0
    for n, local in zip(bags.num_bags, owned.synced, strict=True):
        width = owned.blocks[local].width
        grads.append(grad[:n, start : start + width])
        start += width
    combined = {
        local: row_grads(b, g)
        for local, b, g in zip(owned.synced, bags.blocks(), grads, strict=True)
    }
    if owned.has_sync:
        combined |= replica_sync(routes, rank, exchange, combined, owned.replicated, device=device)
    means = (
        column_sync(routes, rank, exchange, combined, owned.column_split, device=device)
        if owned.has_column_sync
        else {}
    )
    store.apply_row_grads(
        [combined[i][0] for i in owned.synced],
        [combined[i][1] for i in owned.synced],
        [means.get(i) for i in owned.synced],
    )
