"""Reduction-based clusters: owners pool, pooled vectors travel.

Requester side: each feature's IDs are split by row shard (``id % k`` or range)
and sent, with per-sample bag lengths, to every column-shard owner of that row
shard in the requester's replica group. Each owner answers one pooled partial sum
per sample; the requester adds the row shards' partials and places column shards
side by side. Mean pooling divides by the whole bag's length here, where it is
known. Backward sends each request the matching slice of the pooled gradient
(the same slice to every row shard: the gradient of a sum).

Volume per feature ~ ``B * d`` each way whatever the hotness: the right choice for
multi-hot features. The requester receives with one fused unpack-dequantise-reduce
into its ``[B, sum(d)]`` pooled output and sends gradients back with the adjoint
pack (:mod:`lightning_embark.kernels`: Triton on CUDA, the reference ops on the
CPU); the owner pools every block in one kernel call and packs every answer with one
layout. With a hierarchical exchange on several hosts of several ranks, the pooled
rows and their gradients take :class:`HostReduce` (partials added inside the owners'
host before crossing hosts); headers and IDs take the generic hierarchical exchange.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import EngineOptions, mean_multiplier
from lightning_embark.engine.clusters._host_reduce import HostReduce
from lightning_embark.engine.clusters._messages import Counted, Message, OwnerCtx
from lightning_embark.engine.clusters._owner_requests import (
    Distributed,
    Sections,
    pooled_bags,
    request_starts,
    running,
)
from lightning_embark.engine.clusters._remote import RemoteCluster
from lightning_embark.engine.clusters._row_split import RowShardCut, ShardPieces
from lightning_embark.engine.stores import FlatBags
from lightning_embark.kernels import ExchangeLayout, RankSlice, pack, unpack_reduce


@dataclass(frozen=True, kw_only=True)
class _RequestCtx:
    """A requester's step: its batch, and the mean-pooling factors made for it (filled on
    first use and reused by backward)."""

    batch: JaggedBatch
    scales: dict[str, torch.Tensor]


class RBCluster(RemoteCluster):
    """Reduction-based cluster (EMBark RB)."""

    pools_at_owner = True

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        local = options.ranks_per_host
        reduce = routes.cluster.hierarchical and 1 < local < routes.world_size
        self.host_reduce = (
            HostReduce(routes, rank, local, options.group, device=options.device)
            if reduce
            else None
        )
        self.dims = [routes.tables[t].dim for t in routes.slot_table]
        self.offsets = [sum(self.dims[:slot]) for slot in range(len(self.dims))]
        if self.host_reduce is None:
            self.sources = [routes.requests(rank, p) for p in range(routes.world_size)]
        else:
            self.sources = [
                [r for _, r in self.host_reduce.keys(rank, h)]
                for h in range(self.host_reduce.hosts)
            ]
        self._layouts: dict[int, ExchangeLayout] = {}
        self._owner_layouts: dict[tuple[int, ...], ExchangeLayout] = {}
        #: The features whose table is split by rows, cut by row shard for their requests.
        self._shard_cut = RowShardCut(routes, device=options.device)
        self._means = [f.pooling == "mean" for f in routes.features]

    # ----------------------------------------------------------------- requester
    def count(self, batch: JaggedBatch) -> Counted:
        """Every request's ID count on the device (a whole feature's count, or its row
        shard's piece, :meth:`RowShardCut.split`), then the split pieces' counts;
        :meth:`build` makes the ID messages from them on the host."""
        assert batch.num_features == len(self.routes.slot_table), batch.num_features
        split = self._shard_cut.split(batch) if self._shard_cut.slots else None
        features = to_device(batch.counts, dtype=torch.int64, device=batch.device)
        pieces = split.counts if split is not None else features[:0]
        per_request = torch.cat([features, pieces])[self._request_source]
        return Counted(
            values=torch.cat([per_request, pieces]),
            finish=functools.partial(self.build, batch, split),
        )

    @functools.cached_property
    def _request_source(self) -> torch.Tensor:
        """Per request (in :attr:`outgoing` order), where its count is in ``[features'
        counts, split pieces' counts]``."""
        num_features = len(self.routes.slot_table)
        pieces = self._shard_cut.piece_index
        source = [
            request.slot
            if request.slot not in self._shard_cut.slot_set
            else num_features + pieces[(request.slot, request.block.row_shard)]
            for requests in self.outgoing
            for request in requests
        ]
        return to_device(source, dtype=torch.int64, device=self.device)

    def build(self, batch: JaggedBatch, split: ShardPieces | None, values: list[int]) -> Message:
        """The ID messages: per peer, its requests' bag lengths, then IDs, then weights.

        A feature of a table with one row shard sends its IDs and lengths as the batch has
        them. The row-split features are cut in one pass (:meth:`RowShardCut.split`). Everything is
        then one gather from the batch's tensors (and the split's). ``values`` is
        :meth:`count`'s tensor on the host (it gives the split pieces' ID counts).
        """
        size = batch.batch_size
        split_counts = values[self.num_requests :]
        num_features = batch.num_features
        areas = [batch.lengths.reshape(-1)]
        base_lengths = 0
        base_split_lengths = num_features * size
        base_ids = base_split_lengths + (split.lengths.numel() if split is not None else 0)
        if split is not None:
            areas.append(split.lengths.reshape(-1))
        areas.append(batch.values)
        base_split_ids = base_ids + batch.values.numel()
        if split is not None:
            areas.append(split.ids)
        split_starts = running(split_counts)
        weighted = self.weighted
        if weighted:
            base_w = base_split_ids + (split.ids.numel() if split is not None else 0)
            areas.append(_weight_bits(batch.weights, batch.values))
            base_split_w = base_w + batch.values.numel()
            if split is not None:
                areas.append(_weight_bits(split.weights, split.ids))
        segments: list[list[tuple[int, int]]] = []
        counts: list[list[int]] = []
        for requests in self.outgoing:
            lens, ids, weights, per = [], [], [], []
            for request in requests:
                slot = request.slot
                if split is None or slot not in self._shard_cut.slot_set:
                    lens.append((base_lengths + slot * size, size))
                    segment = (batch.starts[slot], batch.counts[slot])
                    ids.append((base_ids + segment[0], segment[1]))
                    if weighted:
                        weights.append((base_w + segment[0], segment[1]))
                else:
                    piece = self._shard_cut.piece_index[(slot, request.block.row_shard)]
                    lens.append((base_split_lengths + piece * size, size))
                    segment = (split_starts[piece], split_counts[piece])
                    ids.append((base_split_ids + segment[0], segment[1]))
                    if weighted:
                        weights.append((base_split_w + segment[0], segment[1]))
                per.append(segment[1])
            segments.append(lens + ids + weights)
            counts.append(per)
        assert [n for per in counts for n in per] == values[: self.num_requests]
        send, sizes = self.gather_message(areas, segments)
        return Message(
            send=send, sizes=sizes, counts=counts, ctx=_RequestCtx(batch=batch, scales={})
        )

    def receive(
        self, ctx: Any, payload: torch.Tensor, sizes: list[int], batch_sizes: list[int]
    ) -> torch.Tensor:
        layout = self.pooled_layout(batch_sizes[self.rank])
        codec = self.forward_codec
        if self.host_reduce is None:
            received, _ = self.exchange(payload, sizes, layout.split_bytes(codec))
        else:
            pieces = self._pieces(payload, batch_sizes, codec)
            received = self.host_reduce.forward(pieces, batch_sizes, codec, self._count)
        # Dequantise, add the row shards' partials and place column shards: one pass.
        return self._scaled(ctx, unpack_reduce(received, layout, codec))

    def encode_grads(self, ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        # Every request gets its slice of the pooled gradient (the adjoint of receive's reduce).
        layout = self.pooled_layout(ctx.batch.batch_size)
        payload, count = pack(self._scaled(ctx, grad), layout, self.backward_codec)
        self._count(count)
        return payload, layout.split_bytes(self.backward_codec)

    def pooled_layout(self, batch_size: int) -> ExchangeLayout:
        """Where the rows answering this rank land in its ``[B, sum(d)]`` pooled output.

        One slice per source in arrival order (owners when flat, hosts when reduced in
        the host), each with one column block per request (key), placed at the
        feature's column offset plus the block's column start.
        """
        if batch_size not in self._layouts:
            if len(self._layouts) >= 8:  # batch sizes seen are few (full, last, empty)
                self._layouts.clear()
            ranks = [
                RankSlice(
                    row_start=0,
                    row_stop=batch_size,
                    blocks=tuple(
                        (self.offsets[r.slot] + r.block.col_start, r.block.width) for r in requests
                    ),
                )
                for requests in self.sources
            ]
            self._layouts[batch_size] = ExchangeLayout(
                ranks=ranks, num_rows=batch_size, num_cols=max(1, sum(self.dims))
            )
        return self._layouts[batch_size]

    def _scaled(self, ctx: _RequestCtx, values: torch.Tensor) -> torch.Tensor:
        """The mean-pooled features' columns times ``1 / max(length, 1)`` per sample (the
        pooled rows forward, their gradients backward: the same factor, made once per step)."""
        if not any(self._means):
            return values
        if "mean" not in ctx.scales:
            ctx.scales["mean"] = mean_multiplier(ctx.batch, self._means, self.dims)
        return values * ctx.scales["mean"]

    # ----------------------------------------------------------------- owner
    def owner_bags(
        self, sections: Sections, batch_sizes: list[int], counts: list[list[int]]
    ) -> tuple[FlatBags | None, FlatBags | None]:
        return tuple(  # type: ignore[return-value]
            pooled_bags(sections, self.incoming, blocks, batch_sizes, counts)
            for _, blocks in self.members
        )

    def owner_forward(
        self, prepared: Distributed, keep: bool
    ) -> tuple[torch.Tensor, list[int], OwnerCtx]:
        """Pool every store's blocks in one kernel call each, then encode every answer with
        one layout (per requester, per request: ``[B_q, width]`` of its block's columns)."""
        outs: list[torch.Tensor | None] = []
        handles: list[Any] = []
        for (store, _), bags in zip(self.members, prepared.bags, strict=True):
            if bags is None:
                outs.append(None)
                handles.append(None)
                continue
            out, handle = store.pooled_flat(
                bags, keep_for_backward=keep and store is self.fused_store
            )
            outs.append(out)
            handles.append(handle)
        batch = self.store_batch(prepared.bags)
        layout = self._owner_layout(tuple(prepared.batch_sizes))
        payload, count = pack(self.stores_output(outs, batch), layout, self.forward_codec)
        self._count(count)
        ctx = OwnerCtx(prepared=prepared, handles=handles, layout=layout)
        return payload, layout.split_bytes(self.forward_codec), ctx

    def _owner_layout(self, batch_sizes: tuple[int, ...]) -> ExchangeLayout:
        """Where each request's pooled rows lie in the stores' output (cached per batch
        sizes: the bags of a block follow source, then request, order)."""
        if batch_sizes not in self._owner_layouts:
            if len(self._owner_layouts) >= 8:
                self._owner_layouts.clear()
            rows = [
                [b] * len(blocks) for b, blocks in zip(batch_sizes, self.incoming, strict=True)
            ]
            starts: dict[tuple[int, int], int] = {}
            for _, blocks in self.members:
                starts |= request_starts(self.incoming, blocks, rows)
            self._owner_layouts[batch_sizes] = self.owner_layout(rows, starts)
        return self._owner_layouts[batch_sizes]

    def grads_to_owners(
        self, owner_ctx: OwnerCtx, encoded: tuple[torch.Tensor, list[int]]
    ) -> torch.Tensor:
        codec = self.backward_codec
        layout = owner_ctx.layout
        assert layout is not None
        batch = self.store_batch(owner_ctx.prepared.bags)
        send, sizes = encoded
        if self.host_reduce is None:
            received, _ = self.exchange(send, sizes, layout.split_bytes(codec))
        else:
            per_source = self.host_reduce.backward(
                send, sizes, owner_ctx.prepared.counts, owner_ctx.prepared.batch_sizes, codec
            )
            received = torch.cat(
                [g.reshape(-1) for per in per_source for g in per]
                or [torch.zeros(0, device=self.device)]
            )
            return _place(received, layout, batch, self.device)
        full = unpack_reduce(received, layout, codec)
        if full.shape[0] < batch:
            full = torch.cat([full, full.new_zeros(batch - full.shape[0], full.shape[1])])
        return full

    def _pieces(
        self, payload: torch.Tensor, batch_sizes: list[int], codec: Any
    ) -> list[list[torch.Tensor]]:
        """The owner's send buffer cut per requester and request (hierarchical reduce)."""
        out, start = [], 0
        for q, blocks in enumerate(self.incoming):
            mine = []
            for local in blocks:
                n = batch_sizes[q] * codec.row_bytes(self.blocks[local].width)
                mine.append(payload[start : start + n])
                start += n
            out.append(mine)
        return out

    def _count(self, nonfinite: torch.Tensor | int) -> None:
        self.count_nonfinite(nonfinite)


def _weight_bits(weights: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """Per-ID weights (fp32) bit-cast to int32 (ones without weights), to ride the IDs."""
    w = weights if weights is not None else torch.ones(ids.numel(), device=ids.device)
    return w.to(torch.float32).contiguous().view(torch.int32)


def _place(
    rows: torch.Tensor, layout: ExchangeLayout, batch: int, device: torch.device
) -> torch.Tensor:
    """Decoded fp32 rows (every segment's, in buffer order) put in place in
    ``[batch, layout.num_cols]``."""
    out = torch.zeros(max(batch, layout.num_rows), layout.num_cols, device=device)
    start = 0
    for r0, n, c0, w in (layout.segments[i : i + 4] for i in range(0, len(layout.segments), 4)):
        out[r0 : r0 + n, c0 : c0 + w] = rows[start : start + n * w].view(n, w)
        start += n * w
    return out
