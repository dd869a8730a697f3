"""Unique-based clusters: unique rows travel, the requester pools.

Requester side: the IDs of every feature reading a table are de-duplicated per
table (``torch.unique``), split by row shard and sent to the shard's column owners,
which answer one row per unique ID. The unique IDs are grouped by row shard, so the
rows answering each request land as one run: one fused unpack-dequantise pass
(:func:`~lightning_embark.kernels.unpack_reduce`) rebuilds every table's unique rows,
and the requester pools each feature locally (sum, per-sample weights, mean).
Backward sums the pooled gradient per unique row (one row per unique ID, whatever its
multiplicity) and sends it to the owners with the adjoint pack; their fused optimizer
also merges the same row asked for by several requesters.

Volume per table ~ ``U * d`` with ``U`` the unique IDs of the local batch: the right
choice when ``U`` is well below ``B * hotness``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lightning_embark.engine._batch import FeatureBatch, mean_scale
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import EngineOptions
from lightning_embark.engine.clusters._remote import Outgoing, RemoteCluster
from lightning_embark.kernels import ColumnBlock, ExchangeLayout, RankSlice, pack, unpack_reduce


def dedupe(values: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The distinct IDs of one table's features, and each feature's index into them."""
    unique, inverse = torch.unique(
        torch.cat([v.to(torch.int64) for v in values]), return_inverse=True
    )
    return unique, list(torch.split(inverse, [v.numel() for v in values]))


def pool_unique(
    inverse: torch.Tensor,
    unique_rows: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """Sum pooling of one feature's bags from the table's unique rows (``offsets``: bag
    starts), in one fused gather-and-sum pass instead of materialising every row."""
    return F.embedding_bag(inverse, unique_rows, offsets, mode="sum", per_sample_weights=weights)


def unique_row_grads(
    num_unique: int,
    inverse: torch.Tensor,
    bag_of: torch.Tensor,
    weights: torch.Tensor,
    grad: torch.Tensor,
) -> torch.Tensor:
    """One feature's gradient per unique row: row ``u`` gets ``sum_i w_i * grad[bag(i)]``
    over its IDs ``i``, a sparse ``(U x B) @ (B x d)`` product (several times faster on
    CPUs than gathering every ID's gradient row)."""
    incidence = torch.sparse_coo_tensor(
        torch.stack([inverse, bag_of]),
        weights,
        (num_unique, grad.shape[0]),
        device=grad.device,
        check_invariants=False,
    )
    return torch.sparse.mm(incidence, grad)


@dataclass(frozen=True, kw_only=True)
class _TableCtx:
    num_unique: int
    inverse: list[
        torch.Tensor
    ]  # per feature of the table (cluster feature order), into the unique rows
    starts: list[int]  # first unique row of each row shard (unique IDs are grouped by shard)
    counts: list[int]  # unique IDs per row shard


def shard_order(
    shard: torch.Tensor, inverse: list[torch.Tensor], k: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """Regroup a table's unique IDs by row shard (stable), so each shard's rows are one run.

    Returns:
        The permutation to apply to the unique IDs, the features' inverse indices
        into the regrouped order, and the unique IDs per shard.
    """
    order = torch.argsort(shard, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.bincount(shard, minlength=k).tolist()
    return order, [position[i] for i in inverse], counts


class UBCluster(RemoteCluster):
    """Unique-based cluster (EMBark UB)."""

    pools_at_owner = False

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        self.dims = [table.dim for table in routes.tables]
        self._table_features = [
            [f for f, t in enumerate(routes.feature_table) if t == table]
            for table in range(len(routes.tables))
        ]
        # Per owner, per request: (table, row shard, its columns), fixed by the plan; only
        # the rows (unique IDs per shard) change from step to step.
        self._request_blocks = [
            [
                (
                    r.slot,
                    r.block.row_shard,
                    ColumnBlock(start=r.block.col_start, width=r.block.width),
                )
                for r in routes.requests(rank, p)
            ]
            for p in range(routes.world_size)
        ]

    def _features_of(self, table: int) -> list[int]:
        """The cluster's features reading ``table`` (cluster feature order)."""
        return self._table_features[table]

    def build(self, batch: list[FeatureBatch]) -> tuple[list[list[Outgoing]], Any]:
        tables: list[_TableCtx] = []
        pieces: dict[tuple[int, int], Outgoing] = {}
        for t, table in enumerate(self.routes.tables):
            unique, inverse = dedupe([batch[f].values for f in self._features_of(t)])
            shard, local = table.split(unique)
            local = local.to(self.routes.id_dtype)  # once per table, not per request
            k = table.layout.num_row_shards
            counts = [unique.numel()]
            if k > 1:
                order, inverse, counts = shard_order(shard, inverse, k)
                local = local[order]
            starts = [sum(counts[:i]) for i in range(k)]
            for i in range(k):
                pieces[(t, i)] = Outgoing(ids=local[starts[i] : starts[i] + counts[i]])
            tables.append(
                _TableCtx(num_unique=unique.numel(), inverse=inverse, starts=starts, counts=counts)
            )
        outgoing = [
            [pieces[(r.slot, r.block.row_shard)] for r in self.routes.requests(self.rank, p)]
            for p in range(self.world)
        ]
        return outgoing, (batch, tables, self.unique_layout(tables), {})

    def unique_layout(self, tables: list[_TableCtx]) -> ExchangeLayout:
        """Where the unique rows answering this rank land in its ``[sum(U), max(d)]`` buffer.

        Table ``t``'s unique rows are rows ``[offset_t, offset_t + U_t)``, columns
        ``[0, d_t)``; a request (row shard ``i``, column shard ``j``) fills the shard's
        run of rows and ``j``'s columns. One entry per owner, one slice per request.
        Which table, row shard and columns each request reads is the plan's, made once
        (:attr:`_request_blocks`); only the rows are the step's.
        """
        offsets = [0]
        for tc in tables:
            offsets.append(offsets[-1] + tc.num_unique)
        ranks = []
        for requests in self._request_blocks:
            parts = []
            for t, row_shard, columns in requests:
                first = offsets[t] + tables[t].starts[row_shard]
                parts.append(
                    RankSlice(
                        row_start=first,
                        row_stop=first + tables[t].counts[row_shard],
                        blocks=(columns,),
                    )
                )
            ranks.append(tuple(parts))
        return ExchangeLayout(ranks=ranks, num_rows=offsets[-1], num_cols=max(self.dims))

    def _table_rows(self, dense: torch.Tensor, tables: list[_TableCtx]) -> list[torch.Tensor]:
        """Each table's ``[U_t, d_t]`` view of the cluster's unique-row buffer."""
        sizes = [tc.num_unique for tc in tables]
        return [rows[:, :d] for rows, d in zip(torch.split(dense, sizes), self.dims, strict=True)]

    def receive(
        self,
        batch: list[FeatureBatch],
        ctx: Any,
        payloads: list[list[torch.Tensor]],
        batch_sizes: list[int],
    ) -> list[torch.Tensor]:
        _, tables, layout, scales = ctx
        received = self.send_rows(payloads, layout.split_bytes(self.forward_codec))
        # Dequantise every request's rows into place (row and column shards): one pass.
        unique_rows = self._table_rows(unpack_reduce(received, layout, self.forward_codec), tables)
        out: list[torch.Tensor] = [torch.empty(0, device=self.device)] * len(batch)
        for t, tc in enumerate(tables):
            for f, inverse in zip(self._features_of(t), tc.inverse, strict=True):
                fb = batch[f]
                if fb.batch_size == 0:
                    out[f] = torch.zeros(0, self.dims[t], device=self.device)
                    continue
                weights = fb.weights.to(torch.float32) if fb.weights is not None else None
                pooled = pool_unique(inverse, unique_rows[t], fb.offsets()[:-1], weights)
                out[f] = (
                    pooled * _mean_scale(scales, f, fb)
                    if self.routes.features[f].pooling == "mean"
                    else pooled
                )
        return out

    def encode_grads(self, ctx: Any, grads: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        batch, tables, layout, scales = ctx
        dense = torch.zeros(layout.num_rows, layout.num_cols, device=self.device)
        unique_grads = self._table_rows(dense, tables)
        for t, tc in enumerate(tables):
            for f, inverse in zip(self._features_of(t), tc.inverse, strict=True):
                fb = batch[f]
                if inverse.numel() == 0:
                    continue
                g = (
                    grads[f] * _mean_scale(scales, f, fb)
                    if self.routes.features[f].pooling == "mean"
                    else grads[f]
                )
                weights = (
                    fb.weights.to(torch.float32)
                    if fb.weights is not None
                    else torch.ones(inverse.numel(), device=inverse.device)
                )
                unique_grads[t].add_(
                    unique_row_grads(tc.num_unique, inverse, fb.bag_of(), weights, g)
                )
        # One gradient per unique row, cut per request in the layout the rows came in.
        payload, count = pack(dense, layout, self.backward_codec)
        self.nonfinite += int(count)
        return payload, layout.split_bytes(self.backward_codec)


def _mean_scale(scales: dict[int, torch.Tensor], f: int, fb: FeatureBatch) -> torch.Tensor:
    """Feature ``f``'s ``1 / max(length, 1)`` column, made once per step (forward scales the
    pooled rows by it, backward their gradient)."""
    if f not in scales:
        scales[f] = mean_scale(fb)
    return scales[f]
