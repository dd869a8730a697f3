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
CPU). With a hierarchical exchange on several hosts of several ranks,
the pooled rows and their gradients take :class:`HostReduce` (partials added inside
the owners' host before crossing hosts); headers and IDs take the generic
hierarchical exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark.engine._batch import FeatureBatch, mean_scale
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import EngineOptions
from lightning_embark.engine.clusters._host_reduce import HostReduce
from lightning_embark.engine.clusters._remote import Outgoing, RemoteCluster
from lightning_embark.kernels import ExchangeLayout, RankSlice, pack_columns, unpack_reduce


@dataclass(frozen=True, kw_only=True)
class _RequestCtx:
    """A requester's step: its batch, and the mean-pooling factors made for it (per feature,
    filled on first use and reused by backward)."""

    batch: list[FeatureBatch]
    scales: dict[int, torch.Tensor]


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

    def build(self, batch: list[FeatureBatch]) -> tuple[list[list[Outgoing]], Any]:
        """Each feature's IDs and bag lengths per row shard, already in the wire's ID dtype.

        A row-split feature is cut in one pass: a stable sort by shard keeps each shard's
        IDs in batch order (as a mask per shard would), and one ``bincount`` of
        ``shard * B + sample`` gives every shard's bag lengths. The tensors are made once per
        feature and shared by the column shards' requests, so the ID message's casts are
        no-ops.
        """
        id_dtype = self.routes.id_dtype
        pieces: dict[tuple[int, int], Outgoing] = {}
        for slot, fb in enumerate(batch):
            table = self.routes.tables[self.routes.slot_table[slot]]
            k = table.layout.num_row_shards
            if k == 1:
                pieces[(slot, 0)] = Outgoing(
                    ids=fb.values.to(id_dtype), lengths=fb.lengths.to(id_dtype), weights=fb.weights
                )
                continue
            shard, local = table.split(fb.values.to(torch.int64))
            size = fb.batch_size
            order = torch.argsort(shard, stable=True)
            counts = torch.bincount(shard, minlength=k).tolist()
            ids = local[order].to(id_dtype).split(counts)
            lengths = (
                torch.bincount(shard * size + fb.bag_of(), minlength=k * size)
                .to(id_dtype)
                .view(k, size)
            )
            weights = fb.weights[order].split(counts) if fb.weights is not None else (None,) * k
            for i in range(k):
                pieces[(slot, i)] = Outgoing(ids=ids[i], lengths=lengths[i], weights=weights[i])
        outgoing = [
            [pieces[(r.slot, r.block.row_shard)] for r in self.routes.requests(self.rank, p)]
            for p in range(self.world)
        ]
        return outgoing, _RequestCtx(batch=batch, scales={})

    def receive(
        self,
        batch: list[FeatureBatch],
        ctx: Any,
        payloads: list[list[torch.Tensor]],
        batch_sizes: list[int],
    ) -> list[torch.Tensor]:
        layout = self.pooled_layout(batch_sizes[self.rank])
        codec = self.forward_codec
        if self.host_reduce is None:
            received = self.send_rows(payloads, layout.split_bytes(codec))
        else:
            received = self.host_reduce.forward(payloads, batch_sizes, codec, self._count)
        # Dequantise, add the row shards' partials and place column shards: one pass.
        pooled = torch.split(unpack_reduce(received, layout, codec), self.dims, dim=1)
        return self._scaled(ctx, list(pooled))

    def encode_grads(self, ctx: Any, grads: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        # Every request gets its slice of the pooled gradient (the adjoint of receive's reduce),
        # packed from the features' gradients as they are: ``pack`` of their concatenation
        # along columns without making it on the CPU (one [B, sum(d)] copy less).
        layout = self.pooled_layout(ctx.batch[0].batch_size)
        payload, count = pack_columns(self._scaled(ctx, grads), layout, self.backward_codec)
        self._count(int(count))
        return payload, layout.split_bytes(self.backward_codec)

    def pooled_layout(self, batch_size: int) -> ExchangeLayout:
        """Where the rows answering this rank land in its ``[B, sum(d)]`` pooled output.

        One slice per source in arrival order (owners when flat, hosts when reduced in
        the host), each with one column block per request (key), placed at the
        feature's column offset plus the block's column start.
        """
        if batch_size not in self._layouts:
            if (
                len(self._layouts) >= 8
            ):  # batch sizes seen are few (full, last, empty); stay bounded
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
                ranks=ranks, num_rows=batch_size, num_cols=sum(self.dims)
            )
        return self._layouts[batch_size]

    def _scaled(self, ctx: _RequestCtx, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Mean-pooled features' ``[B, d]`` values times ``1 / max(length, 1)`` per sample (the
        pooled rows forward, their gradients backward: the same factor, made once per step)."""
        out = []
        for f, (v, feature) in enumerate(zip(values, self.routes.features, strict=True)):
            if feature.pooling == "mean":
                if f not in ctx.scales:
                    ctx.scales[f] = mean_scale(ctx.batch[f])
                v = v * ctx.scales[f]
            out.append(v)
        return out

    def grads_to_owners(
        self, owner_ctx: Any, encoded: tuple[torch.Tensor, list[int]]
    ) -> list[torch.Tensor]:
        if self.host_reduce is None:
            return super().grads_to_owners(owner_ctx, encoded)
        send, sizes = encoded
        per_source = self.host_reduce.backward(
            send, sizes, owner_ctx.pieces, owner_ctx.batch_sizes, self.backward_codec
        )
        block_grads: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for pieces, got in zip(owner_ctx.pieces, per_source, strict=True):
            for piece, g in zip(pieces, got, strict=True):
                block_grads[piece.local].append(g)
        return [
            torch.cat(g) if g else torch.zeros(0, b.width, device=self.device)
            for g, b in zip(block_grads, self.blocks, strict=True)
        ]

    def _count(self, nonfinite: int) -> None:
        self.nonfinite += nonfinite
