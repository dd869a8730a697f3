"""Unique-based clusters: unique rows travel, the requester pools.

Requester side: the IDs of every feature reading a table are de-duplicated per
table (``torch.unique``), split by row shard and sent to the shard's column owners,
which answer one row per unique ID. The requester rebuilds the unique rows and pools
each feature locally (sum, per-sample weights, mean). Backward sums the pooled
gradient per unique row (one row per unique ID, whatever its multiplicity) and sends
it to the owners, whose fused optimizer also merges the same row asked for by
several requesters.

Volume per table ~ ``U * d`` with ``U`` the unique IDs of the local batch: the right
choice when ``U`` is well below ``B * hotness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lightning_embark.engine.clusters import FeatureBatch, mean_scale
from lightning_embark.engine.exchanged import ExchangedCluster, Outgoing
from lightning_embark.engine.routing import Request


def dedupe(values: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The distinct IDs of one table's features, and each feature's index into them."""
    unique, inverse = torch.unique(torch.cat([v.to(torch.int64) for v in values]), return_inverse=True)
    return unique, list(torch.split(inverse, [v.numel() for v in values]))


def pool_unique(
    inverse: torch.Tensor, unique_rows: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """Sum pooling of one feature's bags from the table's unique rows (``offsets``: bag
    starts), in one fused gather-and-sum pass instead of materialising every row."""
    return F.embedding_bag(inverse, unique_rows, offsets, mode="sum", per_sample_weights=weights)


def unique_row_grads(
    num_unique: int, inverse: torch.Tensor, bag_of: torch.Tensor, weights: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """One feature's gradient per unique row: row ``u`` gets ``sum_i w_i * grad[bag(i)]``
    over its IDs ``i``, a sparse ``(U x B) @ (B x d)`` product (several times faster on
    CPUs than gathering every ID's gradient row)."""
    incidence = torch.sparse_coo_tensor(torch.stack([inverse, bag_of]), weights, (num_unique, grad.shape[0]),
                                        check_invariants=False)
    return torch.sparse.mm(incidence, grad)


@dataclass(frozen=True, kw_only=True)
class _TableCtx:
    num_unique: int
    inverse: list[torch.Tensor]  # per feature of the table (cluster feature order)
    shard: torch.Tensor  # row shard of each unique ID


class UBCluster(ExchangedCluster):
    """Unique-based cluster (EMBark UB)."""

    pools_at_owner = False

    def _features_of(self, table: int) -> list[int]:
        return [f for f, t in enumerate(self.routes.feature_table) if t == table]

    def build(self, batch: list[FeatureBatch]) -> tuple[list[list[Outgoing]], Any]:
        tables: list[_TableCtx] = []
        pieces: dict[tuple[int, int], Outgoing] = {}
        for t, table in enumerate(self.routes.tables):
            feats = self._features_of(t)
            unique, inverse = dedupe([batch[f].values for f in feats])
            shard, local = table.split(unique)
            for i in range(table.layout.num_row_shards):
                pieces[(t, i)] = Outgoing(ids=local[shard == i])
            tables.append(_TableCtx(num_unique=unique.numel(), inverse=inverse, shard=shard))
        outgoing = [
            [pieces[(r.slot, r.block.row_shard)] for r in self.routes.requests(self.rank, p)]
            for p in range(self.world)
        ]
        return outgoing, (batch, tables)

    def receive(
        self,
        batch: list[FeatureBatch],
        ctx: Any,
        payloads: list[list[torch.Tensor]],
        outgoing: list[list[Outgoing]],
        headers: list[torch.Tensor],
    ) -> list[torch.Tensor]:
        return self.assemble(batch, ctx, self.rows_to_requesters(payloads, outgoing, headers))

    def encode_grads(self, ctx: Any, grads: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        return self.encode_requests(self.grad_rows(ctx, grads), self.backward_codec)

    def assemble(
        self, batch: list[FeatureBatch], ctx: Any, rows: list[tuple[Request, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """Pooled ``[B, d]`` per feature from the decoded unique rows answering each request."""
        _, tables = ctx
        unique_rows = [torch.zeros(tc.num_unique, table.dim) for tc, table in zip(tables, self.routes.tables)]
        for request, got in rows:
            block = request.block
            mask = tables[request.slot].shard == block.row_shard
            unique_rows[request.slot][mask, block.col_start : block.col_end] = got
        out: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        for t, tc in enumerate(tables):
            for f, inverse in zip(self._features_of(t), tc.inverse, strict=True):
                fb = batch[f]
                if fb.batch_size == 0:
                    out[f] = torch.zeros(0, unique_rows[t].shape[1])
                    continue
                weights = fb.weights.to(torch.float32) if fb.weights is not None else None
                pooled = pool_unique(inverse, unique_rows[t], fb.offsets()[:-1], weights)
                out[f] = pooled * mean_scale(fb) if self.routes.features[f].pooling == "mean" else pooled
        return out

    def grad_rows(self, ctx: Any, grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Per owner, per request: the unique-row gradients of the rows it sent."""
        batch, tables = ctx
        unique_grads = []
        for t, (tc, table) in enumerate(zip(tables, self.routes.tables, strict=True)):
            total = None
            for f, inverse in zip(self._features_of(t), tc.inverse, strict=True):
                fb = batch[f]
                if inverse.numel() == 0:
                    continue
                g = grads[f] * mean_scale(fb) if self.routes.features[f].pooling == "mean" else grads[f]
                weights = fb.weights.to(torch.float32) if fb.weights is not None else torch.ones(inverse.numel())
                part = unique_row_grads(tc.num_unique, inverse, fb.bag_of(), weights, g)
                total = part if total is None else total.add_(part)
            unique_grads.append(total if total is not None else torch.zeros(tc.num_unique, table.dim))
        return [
            [
                unique_grads[r.slot][tables[r.slot].shard == r.block.row_shard, r.block.col_start : r.block.col_end]
                for r in self.routes.requests(self.rank, p)
            ]
            for p in range(self.world)
        ]
