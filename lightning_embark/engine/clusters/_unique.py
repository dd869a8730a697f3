"""A UB requester's local work on its batch: every table's IDs de-duplicated at once,
pooling from the unique rows, and the gradient per unique row.

All tables at once: each table's IDs are shifted into a range of their own (``table
offset + ID``), so one sort de-duplicates every table and leaves the unique IDs grouped
by table (then by row shard, for row-split tables) with no host read
(:func:`unique_runs`); the run lengths are the one thing the cluster copies to the host,
with its header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lightning_embark._host_work import host_work


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
    """Sum pooling of bags from unique rows (``offsets``: bag starts), in one fused
    gather-and-sum pass instead of materialising every row."""
    return F.embedding_bag(inverse, unique_rows, offsets, mode="sum", per_sample_weights=weights)


def unique_row_grads(
    num_unique: int,
    inverse: torch.Tensor,
    bag_of: torch.Tensor,
    weights: torch.Tensor,
    grad: torch.Tensor,
) -> torch.Tensor:
    """The gradient per unique row: row ``u`` gets ``sum_i w_i * grad[bag(i)]`` over the
    IDs ``i`` with ``inverse[i] = u``.

    On a CPU, a sparse ``(U x bags) @ (bags x d)`` product (several times faster there than
    gathering every ID's gradient row); on a GPU, whose sparse product coalesces its
    operand and so reads the merged count on the host, :func:`gathered_row_grads`.
    """
    if grad.device.type != "cpu":
        return gathered_row_grads(num_unique, inverse, bag_of, weights, grad)
    incidence = torch.sparse_coo_tensor(
        torch.stack([inverse, bag_of]),
        weights,
        (num_unique, grad.shape[0]),
        device=grad.device,
        check_invariants=False,
    )
    with host_work():  # a CPU branch: the coalesce's count is a host value already
        return torch.sparse.mm(incidence, grad)


def gathered_row_grads(
    num_unique: int,
    inverse: torch.Tensor,
    bag_of: torch.Tensor,
    weights: torch.Tensor,
    grad: torch.Tensor,
) -> torch.Tensor:
    """:func:`unique_row_grads` as a gather of every ID's gradient row and one
    ``index_add_`` (nothing read on the host: the GPU's path)."""
    contrib = grad[bag_of] * weights.unsqueeze(1).to(grad.dtype)
    return grad.new_zeros(num_unique, grad.shape[1]).index_add_(0, inverse, contrib)


@dataclass(frozen=True, kw_only=True)
class Runs:
    """Every table's distinct IDs grouped by ``(table, row shard)``, still on the device
    (:func:`unique_runs`; :func:`unique_ids` reads them once the run lengths are on the
    host).

    Attributes:
        local: Every ID (sorted, duplicates adjacent) as a row inside its row shard.
        first: Whether each entry of ``local`` is the first of its value.
        position: Each batch ID's unique row (the inverse).
        lengths: int64 ``[tables * width]``: unique IDs per ``(table, shard)`` at
            ``table * width + shard``.
        width: The most row shards of any table.
    """

    local: torch.Tensor
    first: torch.Tensor
    position: torch.Tensor
    lengths: torch.Tensor
    width: int

    def by_shard(self, lengths: list[int], tables: list[Any]) -> dict[tuple[int, int], int]:
        """``lengths`` (:attr:`lengths` on the host) per ``(table, shard)``."""
        shards = [t.layout.num_row_shards for t in tables]
        width = self.width
        return {
            (t, s): lengths[t * width + s] for t in range(len(tables)) for s in range(shards[t])
        }


def unique_runs(shifted: torch.Tensor, table_base: torch.Tensor, tables: list[Any]) -> Runs:
    """Every table's distinct IDs at once, grouped by table, then row shard, with no host
    read.

    ``torch.unique`` would read its output size on the host, and a mask per split table
    would read one per table; instead one sort by ID (and, with row-split tables, a stable
    sort by ``(table, shard)``) puts every run's IDs in order with duplicates adjacent, so
    a first-of-its-value flag ``f`` and ``slot = cumsum(f) - 1`` give each ID its unique
    row, and the flags summed per run are the run lengths. Those lengths size everything
    after, so they are the one thing the caller copies to the host (with the header's
    counts, in one copy).

    Args:
        shifted: Every ID plus its table's first position in one shared range
            (``table_base[t]``; ``table_base`` has one more entry, the range's end).
        table_base: The tables' first positions.
        tables: The tables (:class:`~lightning_embark.engine._routing.TableInfo`), whose
            row split cuts their IDs.
    """
    shards = [t.layout.num_row_shards for t in tables]
    width = max(shards, default=1)
    ids, order = torch.sort(shifted)
    table = torch.bucketize(ids, table_base[1:], right=True)
    local = ids - table_base[table]
    key = table * width
    split = [t for t, k in enumerate(shards) if k > 1]
    if split:
        shard, cut = torch.zeros_like(local), local
        for t in split:  # every ID through each split table's cut, kept where it is its own
            mine = table == t
            shard_t, local_t = tables[t].split(local)
            shard, cut = torch.where(mine, shard_t, shard), torch.where(mine, local_t, cut)
        key = key + shard
        regroup = torch.argsort(key, stable=True)
        ids, order, key, local = ids[regroup], order[regroup], key[regroup], cut[regroup]
    first = torch.ones_like(ids, dtype=torch.bool)
    first[1:] = ids[1:] != ids[:-1]
    slot = torch.cumsum(first, 0) - 1
    position = torch.empty_like(slot)
    position[order] = slot
    lengths = torch.zeros(len(tables) * width, dtype=torch.int64, device=ids.device)
    lengths.index_add_(0, key, first.to(torch.int64))
    return Runs(local=local, first=first, position=position, lengths=lengths, width=width)


def unique_ids(runs: Runs, lengths: list[int]) -> torch.Tensor:
    """The unique IDs of ``runs``, in runs of ``(table, row shard)`` (each run in ID order,
    as ``torch.unique`` of the table alone and a stable sort by shard give), given its run
    lengths on the host (``nonzero_static`` needs its size)."""
    keep = torch.nonzero_static(runs.first, size=sum(lengths)).flatten()
    return runs.local[keep]
