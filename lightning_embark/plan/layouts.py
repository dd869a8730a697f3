"""Builders for the common 3D layouts, so that plans written by hand read like the
layouts of docs/architecture.md#3d-sharding.

Each returns a :class:`TableLayout`; block ``i * c + j`` (row shard ``i``, column
shard ``j``) of replica group ``g`` goes to ``ranks[g][i * c + j]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import RowSplit, TableLayout


def table_wise(table: str, cluster: str, rank: int) -> TableLayout:
    """The whole table on one rank: ``(1, 1, 1)``."""
    return TableLayout(table=table, cluster=cluster, ranks=((rank,),))


def row_wise(
    table: str, cluster: str, ranks: Sequence[int], split: RowSplit = RowSplit.HASH
) -> TableLayout:
    """One row shard per rank: ``(1, len(ranks), 1)``."""
    return TableLayout(
        table=table,
        cluster=cluster,
        num_row_shards=len(ranks),
        row_split=split,
        ranks=(tuple(ranks),),
    )


def column_wise(table: str, cluster: str, ranks: Sequence[int]) -> TableLayout:
    """One column shard per rank: ``(1, 1, len(ranks))``."""
    return TableLayout(
        table=table, cluster=cluster, num_col_shards=len(ranks), ranks=(tuple(ranks),)
    )


def grid(
    table: str, cluster: str, ranks: Sequence[Sequence[int]], split: RowSplit = RowSplit.HASH
) -> TableLayout:
    """``ranks[i][j]`` holds row shard ``i``, column shard ``j``: ``(1, k, c)``."""
    k, c = len(ranks), len(ranks[0])
    if any(len(row) != c for row in ranks):
        raise ConfigError(f"table {table!r}: grid rows must all have {c} ranks, got {ranks}")
    flat = tuple(r for row in ranks for r in row)
    return TableLayout(
        table=table,
        cluster=cluster,
        num_row_shards=k,
        num_col_shards=c,
        row_split=split,
        ranks=(flat,),
    )


def table_row_wise(
    table: str, cluster: str, host: int, ranks_per_host: int, split: RowSplit = RowSplit.HASH
) -> TableLayout:
    """Row shards over the ranks of one host: ``(1, L, 1)``."""
    ranks = range(host * ranks_per_host, (host + 1) * ranks_per_host)
    return row_wise(table, cluster, ranks, split)


def data_parallel(table: str, cluster: str, world_size: int) -> TableLayout:
    """A full replica on every rank (for a DP cluster): ``(W, 1, 1)``."""
    return TableLayout(
        table=table,
        cluster=cluster,
        num_replicas=world_size,
        ranks=tuple((r,) for r in range(world_size)),
    )


def host_data_parallel(table: str, cluster: str, host: int, ranks_per_host: int) -> TableLayout:
    """A full replica on every rank of one host (a DP cluster inside a tower): ``(L, 1, 1)``."""
    return TableLayout(
        table=table,
        cluster=cluster,
        num_replicas=ranks_per_host,
        ranks=tuple((host * ranks_per_host + r,) for r in range(ranks_per_host)),
    )


def replicated(
    table: str,
    cluster: str,
    groups: Sequence[Sequence[int]],
    *,
    num_row_shards: int = 1,
    num_col_shards: int = 1,
    split: RowSplit = RowSplit.HASH,
) -> TableLayout:
    """``r = len(groups)`` replica groups, each placing its ``k * c`` blocks on ``groups[g]``."""
    return TableLayout(
        table=table,
        cluster=cluster,
        num_replicas=len(groups),
        num_row_shards=num_row_shards,
        num_col_shards=num_col_shards,
        row_split=split,
        ranks=tuple(tuple(g) for g in groups),
    )
