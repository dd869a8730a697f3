"""Unique-based clusters: unique rows travel, the requester pools.

Requester side: the IDs of every feature reading a table are de-duplicated per
table, split by row shard and sent to the shard's column owners, which answer one row
per unique ID. All tables at once: each table's IDs are shifted into a range of their
own (``table offset + ID``), so one sort de-duplicates every table and leaves the
unique IDs grouped by table, then row shard (:mod:`._unique`), so the rows answering
each request land as one run. One fused
unpack-dequantise pass (:func:`~lightning_embark.kernels.unpack_reduce`) rebuilds
every table's unique rows and one ``embedding_bag`` pools every feature (sum,
per-sample weights; mean then scales). Backward sums the pooled gradient per unique
row (one row per unique ID, whatever its multiplicity) as a sparse product and sends
it to the owners with the adjoint pack; their fused optimizer also merges the same row
asked for by several requesters.

Owner side: a row per requested ID needs no pooling, so owners read the rows straight
from their store where it can (:meth:`~lightning_embark.engine.stores.ShardStore.gather`)
and encode them in send order; the update is one table-batched kernel call over bags
of one row.

Volume per table ~ ``U * d`` with ``U`` the unique IDs of the local batch: the right
choice when ``U`` is well below ``B * hotness``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import EngineOptions, mean_multiplier
from lightning_embark.engine.clusters._messages import Counted, Message, OwnerCtx
from lightning_embark.engine.clusters._owner_requests import (
    Distributed,
    Sections,
    request_starts,
    row_bags,
)
from lightning_embark.engine.clusters._remote import RemoteCluster
from lightning_embark.engine.clusters._unique import (
    Runs,
    pool_unique,
    unique_ids,
    unique_row_grads,
    unique_runs,
)
from lightning_embark.engine.stores import FlatBags, ShardStore
from lightning_embark.kernels import ExchangeLayout, RankSlice, encode_rows, pack, unpack_reduce


@dataclass(frozen=True, kw_only=True)
class _RequestCtx:
    """A requester's step."""

    batch: JaggedBatch
    inverse: torch.Tensor  # per ID: its row in the unique-row buffer
    layout: ExchangeLayout  # where each request's rows land in that buffer
    scales: dict[str, torch.Tensor]


class UBCluster(RemoteCluster):
    """Unique-based cluster (EMBark UB)."""

    pools_at_owner = False

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        self.dims = [table.dim for table in routes.tables]
        self.feature_dims = [self.dims[t] for t in routes.feature_table]
        self.max_dim = max(self.dims, default=1)
        rows = [table.num_rows for table in routes.tables]
        #: Each table's first ID in the shifted range that de-duplicates all tables at once.
        self._table_base = torch.tensor(
            list(itertools.accumulate(rows, initial=0)), dtype=torch.int64, device=self.device
        )
        self._feature_base = (
            self._table_base[
                torch.tensor(routes.feature_table, dtype=torch.int64, device=self.device)
            ]
            if routes.features
            else self._table_base[:0]
        )
        self._split_tables = [
            t for t, table in enumerate(routes.tables) if table.layout.num_row_shards > 1
        ]
        self._shards = [table.layout.num_row_shards for table in routes.tables]
        # Features by their rank among their table's features: the gradient of a table read
        # by several features adds each feature's sum in feature order.
        seen: dict[int, int] = {}
        self._feature_rank = []
        for t in routes.feature_table:
            self._feature_rank.append(seen.get(t, 0))
            seen[t] = seen.get(t, 0) + 1
        self._means = [f.pooling == "mean" for f in routes.features]
        # Per owner, per request: (table, row shard, its columns), fixed by the plan; only
        # the rows (unique IDs per shard) change from step to step.
        self._request_blocks = [
            [(r.slot, r.block.row_shard, r.block.col_start, r.block.width) for r in requests]
            for requests in self.outgoing
        ]

    # ----------------------------------------------------------------- requester
    def count(self, batch: JaggedBatch) -> Counted:
        """Every table's IDs de-duplicated and grouped by row shard on the device
        (:func:`unique_runs`): each request's count is its run's length; :meth:`build`
        gathers the messages once those lengths are on the host."""
        device = self.device
        if batch.values.numel():
            shifted = batch.values.to(torch.int64) + self._feature_base[batch.feature_of]
        else:
            shifted = torch.zeros(0, dtype=torch.int64, device=device)
        runs = unique_runs(shifted, self._table_base, self.routes.tables)
        return Counted(
            values=torch.cat([runs.lengths[self._request_run], runs.lengths]),
            finish=functools.partial(self.build, batch, runs),
        )

    @functools.cached_property
    def _request_run(self) -> torch.Tensor:
        """Per request (in :attr:`outgoing` order), its run in :attr:`Runs.lengths`."""
        width = max(self._shards, default=1)
        runs = [t * width + s for requests in self._request_blocks for t, s, _, _ in requests]
        return to_device(runs, dtype=torch.int64, device=self.device)

    def build(self, batch: JaggedBatch, runs: Runs, values: list[int]) -> Message:
        """Each owner's requests (one run of unique local IDs each) in one gather, from
        :meth:`count`'s values on the host (its runs' lengths)."""
        routes = self.routes
        lengths = values[self.num_requests :]
        local = unique_ids(runs, lengths)
        inverse = runs.position
        by_run = runs.by_shard(lengths, routes.tables)
        num_tables = len(routes.tables)
        # First row of each (table, shard) run in the unique-row buffer.
        starts, cursor = {}, 0
        for t in range(num_tables):
            for s in range(self._shards[t]):
                starts[(t, s)] = cursor
                cursor += by_run[(t, s)]
        segments, counts_out, ranks = [], [], []
        for requests in self._request_blocks:
            per, mine = [], []
            for t, s, col, width in requests:
                first, n = starts[(t, s)], by_run[(t, s)]
                per.append((first, n))
                mine.append(RankSlice(row_start=first, row_stop=first + n, blocks=((col, width),)))
            segments.append(per)
            counts_out.append([n for _, n in per])
            ranks.append(tuple(mine))
        send, sizes = self.gather_message([local], segments)
        layout = ExchangeLayout(ranks=ranks, num_rows=cursor, num_cols=self.max_dim)
        ctx = _RequestCtx(batch=batch, inverse=inverse, layout=layout, scales={})
        return Message(send=send, sizes=sizes, counts=counts_out, ctx=ctx)

    def receive(
        self, ctx: Any, payload: torch.Tensor, sizes: list[int], batch_sizes: list[int]
    ) -> torch.Tensor:
        layout = ctx.layout
        received, _ = self.exchange(payload, sizes, layout.split_bytes(self.forward_codec))
        # Dequantise every request's rows into place (row and column shards): one pass.
        unique_rows = unpack_reduce(received, layout, self.forward_codec)
        batch = ctx.batch
        weights = batch.weights.to(torch.float32) if batch.weights is not None else None
        pooled = pool_unique(ctx.inverse, unique_rows, batch.bag_offsets[:-1], weights)
        return self._scaled(ctx, self._by_sample(pooled, batch.batch_size))

    def encode_grads(self, ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        batch = ctx.batch
        layout = ctx.layout
        by_bag = self._by_bag(self._scaled(ctx, grad), batch.batch_size)
        dense = torch.zeros(layout.num_rows, layout.num_cols, device=self.device)
        if batch.values.numel():
            weights = (
                batch.weights.to(torch.float32)
                if batch.weights is not None
                else torch.ones(batch.values.numel(), device=self.device)
            )
            ranks = sorted(set(self._feature_rank))
            for rank in ranks:
                inverse, bags, w = ctx.inverse, batch.bag_of, weights
                if len(ranks) > 1:  # a table read by several features: one sum per feature
                    mine = to_device(
                        [r == rank for r in self._feature_rank],
                        dtype=torch.bool,
                        device=self.device,
                    )
                    mask = mine[batch.feature_of]
                    inverse, bags, w = inverse[mask], bags[mask], w[mask]
                dense.add_(unique_row_grads(layout.num_rows, inverse, bags, w, by_bag))
        # One gradient per unique row, cut per request in the layout the rows came in.
        payload, count = pack(dense, layout, self.backward_codec)
        self.count_nonfinite(count)
        return payload, layout.split_bytes(self.backward_codec)

    def _by_sample(self, pooled: torch.Tensor, size: int) -> torch.Tensor:
        """``[F * B, max(d)]`` pooled bags (feature-major) as ``[B, sum(d)]``."""
        num = len(self.feature_dims)
        if size == 0 or num == 0:
            return pooled.new_zeros(size, sum(self.feature_dims))
        by_feature = pooled.view(num, size, self.max_dim)
        if all(d == self.max_dim for d in self.feature_dims):
            return by_feature.transpose(0, 1).reshape(size, num * self.max_dim)
        return torch.cat([by_feature[f, :, :d] for f, d in enumerate(self.feature_dims)], dim=1)

    def _by_bag(self, grad: torch.Tensor, size: int) -> torch.Tensor:
        """:meth:`_by_sample`'s adjoint: ``[B, sum(d)]`` as ``[F * B, max(d)]`` (zero padded)."""
        num = len(self.feature_dims)
        if all(d == self.max_dim for d in self.feature_dims):
            return grad.reshape(size, num, self.max_dim).transpose(0, 1).reshape(-1, self.max_dim)
        out = grad.new_zeros(num, size, self.max_dim)
        start = 0
        for f, d in enumerate(self.feature_dims):
            out[f, :, :d] = grad[:, start : start + d]
            start += d
        return out.reshape(-1, self.max_dim)

    def _scaled(self, ctx: _RequestCtx, values: torch.Tensor) -> torch.Tensor:
        if not any(self._means):
            return values
        if "mean" not in ctx.scales:
            ctx.scales["mean"] = mean_multiplier(ctx.batch, self._means, self.feature_dims)
        return values * ctx.scales["mean"]

    # ----------------------------------------------------------------- owner
    def owner_bags(
        self, sections: Sections, batch_sizes: list[int], counts: list[list[int]]
    ) -> tuple[FlatBags | None, FlatBags | None]:
        return tuple(  # type: ignore[return-value]
            row_bags(sections.ids, self.incoming, blocks, counts) for _, blocks in self.members
        )

    def owner_forward(
        self, prepared: Distributed, keep: bool
    ) -> tuple[torch.Tensor, list[int], OwnerCtx]:
        """Every requested row, read straight from the store in send order where it can,
        else looked up as bags of one row; encoded in one call."""
        codec = self.forward_codec
        counts = prepared.counts
        sizes = [
            sum(
                n * codec.row_bytes(self.blocks[local].width)
                for local, n in zip(blocks, per, strict=True)
            )
            for blocks, per in zip(self.incoming, counts, strict=True)
        ]
        rows = self._gathered(prepared)
        if rows is not None:
            payload, count = encode_rows(rows, codec)
            self.count_nonfinite(count)
            return (
                payload.reshape(-1),
                sizes,
                OwnerCtx(prepared=prepared, handles=[None, None], layout=None),
            )
        outs = [
            store.pooled_flat(bags, keep_for_backward=False)[0] if bags is not None else None
            for (store, _), bags in zip(self.members, prepared.bags, strict=True)
        ]
        layout = self._owner_layout(counts)
        payload, count = pack(
            self.stores_output(outs, self.store_batch(prepared.bags)), layout, codec
        )
        self.count_nonfinite(count)
        return payload, sizes, OwnerCtx(prepared=prepared, handles=[None, None], layout=layout)

    def _gathered(self, prepared: Distributed) -> torch.Tensor | None:
        """The requested rows in send order, read from the fused store (None when some
        blocks are synced or the store cannot read rows directly)."""
        if self.synced or not self.fused:
            return None
        position = {local: t for t, local in enumerate(self.fused)}
        blocks, counts = [], []
        for q_blocks, per in zip(self.incoming, prepared.counts, strict=True):
            blocks += [position[local] for local in q_blocks]
            counts += per
        total = sum(counts)
        owner = torch.repeat_interleave(
            to_device(blocks, dtype=torch.int64, device=self.device),
            to_device(counts, dtype=torch.int64, device=self.device),
            output_size=total,
        )
        return self.fused_store.gather(owner, prepared.ids)

    def _owner_layout(self, counts: list[list[int]]) -> ExchangeLayout:
        starts: dict[tuple[int, int], int] = {}
        for _, blocks in self.members:
            starts |= request_starts(self.incoming, blocks, counts)
        return self.owner_layout(counts, starts)

    def grads_to_owners(
        self, owner_ctx: OwnerCtx, encoded: tuple[torch.Tensor, list[int]]
    ) -> torch.Tensor:
        """The gradient rows (one per requested ID, send order) put where the stores' bags
        of one row are, ``[batch, store_width]``."""
        codec = self.backward_codec
        prepared = owner_ctx.prepared
        layout = owner_ctx.layout or self._owner_layout(prepared.counts)
        send, sizes = encoded
        received, _ = self.exchange(send, sizes, layout.split_bytes(codec))
        full = unpack_reduce(received, layout, codec)
        batch = self.store_batch(prepared.bags)
        if full.shape[0] < batch:
            full = torch.cat([full, full.new_zeros(batch - full.shape[0], full.shape[1])])
        return full

    def owner_backward(
        self, store: ShardStore, bags: FlatBags, handle: Any, grad: torch.Tensor
    ) -> None:
        """One kernel call over every block's rows (bags of one) with their gradients."""
        store.apply_flat(bags, grad.contiguous())
