"""Static routing of one cluster: which blocks each rank owns and who asks whom for what.

Everything here is a pure function of the plan and the table shapes, computed the
same way on every rank, so senders and receivers agree on message layouts without
sending them: only counts that depend on the batch travel in headers.

Terms: a *slot* is what a requester asks a block for - a feature (RB: one pooled
vector per sample and feature) or a table (UB: IDs de-duplicated per table). A
*request* is one slot's traffic to one block. Requests from requester ``q`` to
owner ``p`` are ordered by slot, then block index ``i * c + j``; an owner
concatenates the bags of a block over requesters in rank order, then request order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterPlan, ClusterType, RowSplit, TableLayout

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class TableInfo:
    """A table as the engine sees it: the plan's name, shape and layout."""

    name: str
    num_rows: int
    dim: int
    layout: TableLayout

    def split(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row shard of each global ID and its row index inside that shard (on ``ids``'
        device)."""
        k = self.layout.num_row_shards
        if k == 1:
            return torch.zeros_like(ids), ids
        if self.layout.row_split is RowSplit.HASH:
            return ids % k, torch.div(ids, k, rounding_mode="floor")
        starts = self.range_starts_on(ids.device)
        shard = torch.bucketize(ids, starts[1:], right=True)
        return shard, ids - starts[shard]

    @cached_property
    def range_starts(self) -> torch.Tensor:
        """First global row of every row shard (int64, on the host: plan metadata)."""
        k = self.layout.num_row_shards
        return torch.tensor(
            [self.layout.row_range(i, self.num_rows)[0] for i in range(k)],
            dtype=torch.int64,
            device="cpu",
        )

    @cached_property
    def _range_starts_by_device(self) -> dict[torch.device, torch.Tensor]:
        return {}

    def range_starts_on(self, device: torch.device) -> torch.Tensor:
        """:attr:`range_starts` on ``device``, copied there once and kept (it meets the IDs
        of every step)."""
        cache = self._range_starts_by_device
        if device not in cache:
            cache[device] = self.range_starts.to(device)
        return cache[device]

    def global_rows(self, row_shard: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global IDs of a row shard's rows, in local order, on ``device``."""
        k = self.layout.num_row_shards
        if self.layout.row_split is RowSplit.HASH:
            return torch.arange(row_shard, self.num_rows, k, device=device)
        start, end = self.layout.row_range(row_shard, self.num_rows)
        return torch.arange(start, end, device=device)


@dataclass(frozen=True, kw_only=True)
class FeatureInfo:
    """One input feature (KJT key) reading a table, pooled by ``sum`` or ``mean``."""

    name: str
    table: str
    pooling: str = "sum"


@dataclass(frozen=True, kw_only=True)
class Block:
    """One block of a table: row shard ``i``, column shard ``j`` of replica group ``g``."""

    table: int  # index into the cluster's tables
    replica: int
    row_shard: int
    col_shard: int
    owner: int
    num_rows: int
    col_start: int
    col_end: int

    @property
    def width(self) -> int:
        return self.col_end - self.col_start


@dataclass(frozen=True, kw_only=True)
class Request:
    """One slot's traffic to one block; ``local`` is the block's index at its owner."""

    slot: int
    block: Block
    local: int


class ClusterRoutes:
    """The routing of one cluster over a world of ``world_size`` ranks.

    Args:
        cluster: The cluster's plan.
        tables: The cluster's tables in model order.
        features: The cluster's features in model order (each reads one of ``tables``).
        world_size: Ranks in the cluster's process group.
    """

    def __init__(
        self,
        cluster: ClusterPlan,
        tables: list[TableInfo],
        features: list[FeatureInfo],
        world_size: int,
    ) -> None:
        self.cluster = cluster
        self.tables = tables
        self.features = features
        self.world_size = world_size
        index = {t.name: i for i, t in enumerate(tables)}
        self.feature_table = [index[f.table] for f in features]
        # UB de-duplicates per table; RB pools per feature.
        self.slot_table = (
            self.feature_table if cluster.type is not ClusterType.UB else list(range(len(tables)))
        )
        self.blocks: list[list[Block]] = [[] for _ in range(world_size)]
        self._block_local: dict[tuple[int, int, int], int] = {}
        for t, table in enumerate(tables):
            layout = table.layout
            width = table.dim // layout.num_col_shards
            for g, ranks in enumerate(layout.ranks):
                for b, owner in enumerate(ranks):
                    i, j = divmod(b, layout.num_col_shards)
                    if not 0 <= owner < world_size:
                        raise ConfigError(
                            f"table {table.name!r}: block on rank {owner}, outside a world of "
                            f"{world_size}"
                        )
                    block = Block(
                        table=t,
                        replica=g,
                        row_shard=i,
                        col_shard=j,
                        owner=owner,
                        num_rows=layout.shard_rows(i, table.num_rows),
                        col_start=j * width,
                        col_end=(j + 1) * width,
                    )
                    self._block_local[(t, g, b)] = len(self.blocks[owner])
                    self.blocks[owner].append(block)
        max_rows = max((b.num_rows for bl in self.blocks for b in bl), default=0)
        self.id_dtype = torch.int32 if max_rows <= INT32_MAX else torch.int64

    def replica(self, table: int, requester: int) -> int:
        return self.tables[table].layout.replica_of(requester, self.world_size)

    def block_at(self, table: int, replica: int, index: int) -> Request:
        layout = self.tables[table].layout
        owner = layout.ranks[replica][index]
        local = self._block_local[(table, replica, index)]
        return Request(slot=-1, block=self.blocks[owner][local], local=local)

    @cached_property
    def _requests(self) -> list[list[list[Request]]]:
        out: list[list[list[Request]]] = [
            [[] for _ in range(self.world_size)] for _ in range(self.world_size)
        ]
        for q in range(self.world_size):
            for slot, t in enumerate(self.slot_table):
                g = self.replica(t, q)
                layout = self.tables[t].layout
                for b in range(layout.num_row_shards * layout.num_col_shards):
                    found = self.block_at(t, g, b)
                    out[q][found.block.owner].append(
                        Request(slot=slot, block=found.block, local=found.local)
                    )
        return out

    def requests(self, requester: int, owner: int) -> list[Request]:
        """Requests from ``requester`` to ``owner`` in wire order."""
        return self._requests[requester][owner]

    def replicated_peers(self, owner: int) -> list[tuple[int, Block, list[Block]]]:
        """For each replicated block ``owner`` holds: ``(local index, block, blocks of all
        replicas)``."""
        out = []
        for local, block in enumerate(self.blocks[owner]):
            layout = self.tables[block.table].layout
            if layout.num_replicas > 1:
                b = block.row_shard * layout.num_col_shards + block.col_shard
                peers = [
                    self.block_at(block.table, g, b).block for g in range(layout.num_replicas)
                ]
                out.append((local, block, peers))
        return out

    def sync_pairs(self, sender: int, receiver: int) -> list[tuple[int, int]]:
        """Replica sync messages ``sender -> receiver``: (sender's local block, receiver's local
        block)."""
        out = []
        for local, block, peers in self.replicated_peers(sender):
            for peer in peers:
                if peer.replica != block.replica and peer.owner == receiver:
                    layout = self.tables[block.table].layout
                    b = block.row_shard * layout.num_col_shards + block.col_shard
                    out.append((local, self._block_local[(block.table, peer.replica, b)]))
        return out

    def column_peers(self, owner: int) -> list[tuple[int, Block, list[Block]]]:
        """For each column-split block ``owner`` holds: ``(local index, block, its row's column
        blocks)``."""
        out = []
        for local, block in enumerate(self.blocks[owner]):
            layout = self.tables[block.table].layout
            if layout.num_col_shards > 1:
                base = block.row_shard * layout.num_col_shards
                peers = [
                    self.block_at(block.table, block.replica, base + j).block
                    for j in range(layout.num_col_shards)
                ]
                out.append((local, block, peers))
        return out

    def column_pairs(self, sender: int, receiver: int) -> list[tuple[int, int]]:
        """Column sync messages ``sender -> receiver``: (sender's local block, receiver's local
        block)."""
        out = []
        for local, block, peers in self.column_peers(sender):
            layout = self.tables[block.table].layout
            for peer in peers:
                if peer.col_shard != block.col_shard and peer.owner == receiver:
                    b = peer.row_shard * layout.num_col_shards + peer.col_shard
                    out.append((local, self._block_local[(block.table, peer.replica, b)]))
        return out
