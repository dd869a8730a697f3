"""Reduction-based clusters: owners pool, pooled vectors travel.

Requester side: each feature's IDs are split by row shard (``id % k`` or range)
and sent, with per-sample bag lengths, to every column-shard owner of that row
shard in the requester's replica group. Each owner answers one pooled partial sum
per sample; the requester adds the row shards' partials and places column shards
side by side. Mean pooling divides by the whole bag's length here, where it is
known. Backward sends each request the matching slice of the pooled gradient
(the same slice to every row shard: the gradient of a sum).

Volume per feature ~ ``B * d`` each way whatever the hotness: the right choice for
multi-hot features. With a hierarchical exchange on several hosts of several ranks,
the pooled rows and their gradients take :class:`HostReduce` (partials added inside
the owners' host before crossing hosts); headers and IDs take the generic
hierarchical exchange.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_embark.engine.clusters import EngineOptions, FeatureBatch, mean_scale
from lightning_embark.engine.exchanged import ExchangedCluster, Outgoing
from lightning_embark.engine.host_reduce import HostReduce
from lightning_embark.engine.routing import ClusterRoutes, Request


class RBCluster(ExchangedCluster):
    """Reduction-based cluster (EMBark RB)."""

    pools_at_owner = True

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        local = options.ranks_per_host
        reduce = routes.cluster.hierarchical and 1 < local < routes.world_size
        self.host_reduce = HostReduce(routes, rank, local, options.group) if reduce else None

    def build(self, batch: list[FeatureBatch]) -> tuple[list[list[Outgoing]], Any]:
        pieces: dict[tuple[int, int], Outgoing] = {}
        for slot, fb in enumerate(batch):
            table = self.routes.tables[self.routes.slot_table[slot]]
            values = fb.values.to(torch.int64)
            k = table.layout.num_row_shards
            if k == 1:
                pieces[(slot, 0)] = Outgoing(ids=values, lengths=fb.lengths.to(torch.int64), weights=fb.weights)
                continue
            shard, local = table.split(values)
            bag_of = fb.bag_of()
            for i in range(k):
                mask = shard == i
                pieces[(slot, i)] = Outgoing(
                    ids=local[mask],
                    lengths=torch.bincount(bag_of[mask], minlength=fb.batch_size),
                    weights=fb.weights[mask] if fb.weights is not None else None,
                )
        outgoing = [
            [pieces[(r.slot, r.block.row_shard)] for r in self.routes.requests(self.rank, p)]
            for p in range(self.world)
        ]
        return outgoing, batch

    def assemble(
        self, batch: list[FeatureBatch], ctx: Any, rows: list[tuple[Request, torch.Tensor]]
    ) -> list[torch.Tensor]:
        dims = [self.routes.tables[t].dim for t in self.routes.slot_table]
        out = [torch.zeros(fb.batch_size, d) for fb, d in zip(batch, dims, strict=True)]
        for request, got in rows:  # partial sums of row shards add up; column shards sit side by side
            out[request.slot][:, request.block.col_start : request.block.col_end] += got
        return [
            o * mean_scale(fb) if f.pooling == "mean" else o
            for o, fb, f in zip(out, batch, self.routes.features, strict=True)
        ]

    def _scaled(self, batch: list[FeatureBatch], grads: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            g * mean_scale(fb) if f.pooling == "mean" else g
            for g, fb, f in zip(grads, batch, self.routes.features, strict=True)
        ]

    def grad_rows(self, ctx: Any, grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        scaled = self._scaled(ctx, grads)
        return [
            [scaled[r.slot][:, r.block.col_start : r.block.col_end].contiguous() for r in self.routes.requests(self.rank, p)]
            for p in range(self.world)
        ]

    def rows_to_requesters(
        self, payloads: list[list[torch.Tensor]], outgoing: list[list[Outgoing]], headers: list[torch.Tensor]
    ) -> list[tuple[Request, torch.Tensor]]:
        if self.host_reduce is None:
            return super().rows_to_requesters(payloads, outgoing, headers)
        return self.host_reduce.forward(payloads, [int(h[0]) for h in headers], self.forward_codec, self._count)

    def grads_to_owners(self, owner_ctx: Any, req_ctx: Any, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.host_reduce is None:
            return super().grads_to_owners(owner_ctx, req_ctx, grads)
        scaled = self._scaled(req_ctx, grads)
        key_grads: dict[tuple[int, int], torch.Tensor] = {}
        for host in range(self.host_reduce.hosts):
            for key, request in self.host_reduce.keys(self.rank, host):
                if key not in key_grads:
                    rows = scaled[request.slot][:, request.block.col_start : request.block.col_end].contiguous()
                    result = self.backward_codec.encode(rows)
                    self._count(int(result.num_nonfinite))
                    key_grads[key] = result.payload
        per_source = self.host_reduce.backward(key_grads, owner_ctx.pieces, owner_ctx.batch_sizes, self.backward_codec)
        block_grads: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for pieces, got in zip(owner_ctx.pieces, per_source, strict=True):
            for piece, g in zip(pieces, got, strict=True):
                block_grads[piece.local].append(g)
        return [torch.cat(g) if g else torch.zeros(0, b.width) for g, b in zip(block_grads, self.blocks, strict=True)]

    def _count(self, nonfinite: int) -> None:
        self.nonfinite += nonfinite
