"""A reduction-based cluster's row-split features: their IDs cut by row shard.

A table split by rows into ``k`` shards gets one request per shard owner, so a requester
cuts each such feature's IDs into ``k`` pieces (``(feature, shard)``, in slot then shard
order), each with its local IDs (``id % k`` or the range's offset, as the table's layout
says), its bag lengths and its weights. :class:`RowShardCut` does that for every row-split
feature of a cluster in one pass on the device; the cluster builds its ID messages from
the pieces.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import JaggedBatch, bin_counts
from lightning_embark.engine._routing import ClusterRoutes


@dataclass(frozen=True, kw_only=True)
class ShardPieces:
    """The row-split features' IDs cut by row shard (:meth:`RowShardCut.split`): per piece
    ``(slot, shard)`` in slot then shard order, its local IDs, bag lengths and weights."""

    ids: torch.Tensor
    lengths: torch.Tensor  # [pieces, B]
    weights: torch.Tensor | None
    counts: torch.Tensor  # IDs per piece (int64, on the device)


class RowShardCut:
    """The row-split slots of a cluster's routes and how their IDs are cut.

    Args:
        routes: The cluster's routes.
        device: Where the batches are (the engine's device).
    """

    def __init__(self, routes: ClusterRoutes, *, device: torch.device) -> None:
        self.routes = routes
        self.device = device
        #: Slots whose table is split by rows.
        self.slots = [
            slot
            for slot, t in enumerate(routes.slot_table)
            if routes.tables[t].layout.num_row_shards > 1
        ]

    @functools.cached_property
    def slot_set(self) -> frozenset[int]:
        """:attr:`slots` as a set."""
        return frozenset(self.slots)

    @functools.cached_property
    def shards(self) -> list[int]:
        """Row shards of each row-split slot's table."""
        routes = self.routes
        return [routes.tables[routes.slot_table[s]].layout.num_row_shards for s in self.slots]

    @functools.cached_property
    def piece_index(self) -> dict[tuple[int, int], int]:
        """``(slot, shard)`` -> piece, in slot then shard order."""
        pieces = (
            (slot, s) for slot, k in zip(self.slots, self.shards, strict=True) for s in range(k)
        )
        return {piece: n for n, piece in enumerate(pieces)}

    @functools.cached_property
    def _kept_pieces(self) -> torch.Tensor:
        """The real pieces among ``(feature, shard)`` of the widest split (smaller tables'
        padding shards are empty)."""
        width = max(self.shards)
        keep = [i * width + s for i, k in enumerate(self.shards) for s in range(k)]
        return to_device(keep, dtype=torch.int64, device=self.device)

    def split(self, batch: JaggedBatch) -> ShardPieces:
        """Every row-split feature's IDs cut by row shard in one pass.

        A stable sort by ``(feature, shard)`` keeps each shard's IDs in batch order (as a
        mask per shard would), and one count of ``(feature, shard) * B + sample``
        gives every piece's bag lengths; nothing comes to the host. Called only when the
        cluster has row-split features (:attr:`slots`).
        """
        assert self.slots, "no row-split feature to cut"
        routes = self.routes
        size = batch.batch_size
        slots = self.slots
        sub = batch.select(slots)
        shards, locals_ = [], []
        for i, slot in enumerate(slots):
            table = routes.tables[routes.slot_table[slot]]
            shard, local = table.split(sub.feature(i).values.to(torch.int64))
            shards.append(shard)
            locals_.append(local)
        width = max(self.shards)
        shard, local = torch.cat(shards), torch.cat(locals_)
        key = sub.feature_of * width + shard
        order = torch.argsort(key, stable=True)
        pieces = len(slots) * width
        counts = bin_counts(key, pieces)
        bag = sub.bag_of - sub.feature_of * size  # sample of each ID
        lengths = bin_counts(key * size + bag, pieces * size).view(pieces, size)
        keep = self._kept_pieces
        # Pieces are in (feature, shard) order; the padding shards of smaller k are empty.
        return ShardPieces(
            ids=local[order],
            lengths=lengths.index_select(0, keep),
            weights=sub.weights[order] if sub.weights is not None else None,
            counts=counts.index_select(0, keep),
        )
