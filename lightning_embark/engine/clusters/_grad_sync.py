"""Gradient syncs that keep sharded updates equal to the unsharded ones.

* :func:`replica_sync` - a replicated table's block (``r > 1``) adds the row
  gradients of its copies in the other replica groups before updating. Each
  replica sends its peers a header (unique rows per block pair, int64) and one
  byte payload of ``[row id | fp32 gradient]`` rows; every copy sums the
  contributions in replica order, so the copies stay bit-identical.
* :func:`column_sync` - row-wise Adagrad keeps one state per row, grown by the
  mean of the row's squared gradient over *all* its columns; the column shards of a
  row shard see the same bags, hence the same unique rows in the same order, so
  only each row's fp32 sum of squares travels (no header), added in column order.

Both ride the cluster's exchange (flat or hierarchical) and use fp32: they are
exact whatever the cluster's compression. Headers and payloads are made on the
cluster's device (the collectives' device); received counts come to the host once.
"""

from __future__ import annotations

import torch

from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.exchange import AllToAll

HEADER_DTYPE = torch.int64
RowGrads = tuple[torch.Tensor, torch.Tensor]  # unique local rows, their summed gradient


def replica_sync(
    routes: ClusterRoutes,
    rank: int,
    exchange: AllToAll,
    local_rows: dict[int, RowGrads],
    replicated: list[int],
    *,
    device: torch.device,
) -> dict[int, RowGrads]:
    """Sum each replicated block's row gradients over its replicas, in replica order.

    Args:
        routes: The cluster's routing.
        rank: This rank.
        exchange: The cluster's exchange.
        local_rows: This rank's row gradients per local block (at least the replicated ones).
        replicated: Local indices of this rank's replicated blocks.
        device: The cluster's device: the header and payload are made there even when
            this rank sends nothing, as the collective needs.

    Returns:
        The combined row gradients of every replicated block.
    """
    blocks = routes.blocks[rank]
    id_dtype = routes.id_dtype
    id_bytes = id_dtype.itemsize
    header, payload, sizes = [], [], []
    for p in range(routes.world_size):
        pairs = routes.sync_pairs(rank, p)
        header.append(
            torch.tensor(
                [local_rows[s][0].numel() for s, _ in pairs], dtype=HEADER_DTYPE, device=device
            )
        )
        size = 0
        for s, _ in pairs:
            rows, grads = local_rows[s]
            width = blocks[s].width
            packed = torch.cat(
                [
                    rows.to(id_dtype).view(torch.uint8).reshape(rows.numel(), id_bytes),
                    grads.contiguous().view(torch.uint8).reshape(rows.numel(), 4 * width),
                ],
                dim=1,
            )
            payload.append(packed.reshape(-1))
            size += packed.numel()
        sizes.append(size)
    recv_pairs = [routes.sync_pairs(q, rank) for q in range(routes.world_size)]
    counts, _ = exchange(
        torch.cat(header), [h.numel() for h in header], [len(pairs) for pairs in recv_pairs]
    )
    counts_by_source = split_list(counts.tolist(), [len(pairs) for pairs in recv_pairs])
    recv_sizes = [
        sum(n * (id_bytes + 4 * blocks[r].width) for n, (_, r) in zip(c, pairs, strict=True))
        for c, pairs in zip(counts_by_source, recv_pairs, strict=True)
    ]
    send = torch.cat(payload) if payload else torch.zeros(0, dtype=torch.uint8, device=device)
    received, _ = exchange(send, sizes, recv_sizes)
    contributions: dict[int, dict[int, RowGrads]] = {
        i: {blocks[i].replica: local_rows[i]} for i in replicated
    }
    for q, data in enumerate(torch.split(received, recv_sizes)):
        start = 0
        for n, (s, r) in zip(counts_by_source[q], recv_pairs[q], strict=True):
            width = blocks[r].width
            nbytes = n * (id_bytes + 4 * width)
            packed = data[start : start + nbytes].reshape(n, id_bytes + 4 * width)
            start += nbytes
            rows = packed[:, :id_bytes].contiguous().view(id_dtype).reshape(-1).to(torch.int64)
            grads = packed[:, id_bytes:].contiguous().view(torch.float32).reshape(n, width)
            contributions[r][routes.blocks[q][s].replica] = (rows, grads)
    out = {}
    for i, parts in contributions.items():
        ordered = [parts[g] for g in sorted(parts)]
        rows, inverse = torch.unique(torch.cat([r for r, _ in ordered]), return_inverse=True)
        grads = torch.cat([g for _, g in ordered])
        summed = grads.new_zeros(rows.numel(), blocks[i].width).index_add_(0, inverse, grads)
        out[i] = (rows, summed)
    return out


def column_sync(
    routes: ClusterRoutes,
    rank: int,
    exchange: AllToAll,
    combined: dict[int, RowGrads],
    column_split: list[int],
    *,
    device: torch.device,
) -> dict[int, torch.Tensor]:
    """Row-wise Adagrad on column-split tables: ``mean(g**2)`` over the whole row.

    Args:
        routes: The cluster's routing.
        rank: This rank.
        exchange: The cluster's exchange.
        combined: Row gradients per local block (after any replica sync).
        column_split: Local indices of this rank's column-split blocks.
        device: The cluster's device (where an empty send buffer is made).

    Returns:
        Per column-split block, each unique row's mean squared gradient over the full width.
    """
    blocks = routes.blocks[rank]
    send: list[torch.Tensor] = []
    sizes: list[int] = []
    for p in range(routes.world_size):
        parts = [(combined[s][1] ** 2).sum(1) for s, _ in routes.column_pairs(rank, p)]
        send += parts
        sizes.append(sum(x.numel() for x in parts))
    recv_pairs = [routes.column_pairs(q, rank) for q in range(routes.world_size)]
    recv_sizes = [sum(combined[r][0].numel() for _, r in pairs) for pairs in recv_pairs]
    received, _ = exchange(
        torch.cat(send) if send else torch.zeros(0, device=device), sizes, recv_sizes
    )
    partials = {i: {blocks[i].col_shard: (combined[i][1] ** 2).sum(1)} for i in column_split}
    for q, data in enumerate(torch.split(received, recv_sizes)):
        start = 0
        for s, r in recv_pairs[q]:
            n = combined[r][0].numel()
            partials[r][routes.blocks[q][s].col_shard] = data[start : start + n]
            start += n
    means: dict[int, torch.Tensor] = {}
    for i, by_column in partials.items():
        total = torch.zeros_like(by_column[blocks[i].col_shard])
        for j in sorted(by_column):
            total = total + by_column[j]
        means[i] = total / routes.tables[blocks[i].table].dim
    return means


def split_list(values: list[int], sizes: list[int]) -> list[list[int]]:
    """``values`` cut into consecutive runs of ``sizes`` (a host-side ``torch.split``)."""
    out, start = [], 0
    for n in sizes:
        out.append(values[start : start + n])
        start += n
    return out
