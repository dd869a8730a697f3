"""Static routing of a cluster: ID -> (row shard, local row) and back, block placement,
request order, replica and column sync pairs, and the ID dtype threshold.

Everything here is pure and exact (integers), so every check is an equality.
"""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine._routing import INT32_MAX, ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, RowSplit, TableLayout

RB = ClusterPlan(name="c", type=ClusterType.RB)
UB = ClusterPlan(name="c", type=ClusterType.UB)


def _routes(
    cluster: ClusterPlan,
    world: int,
    tables: list[tuple[TableLayout, int, int]],
    features: list[tuple[str, str]] | None = None,
) -> ClusterRoutes:
    """Routes of ``(layout, rows, dim)`` tables; features default to one per table."""
    infos = [
        TableInfo(name=lay.table, num_rows=rows, dim=dim, layout=lay) for lay, rows, dim in tables
    ]
    feats = features or [(t.name, t.name) for t in infos]
    return ClusterRoutes(cluster, infos, [FeatureInfo(name=f, table=t) for f, t in feats], world)


# ----------------------------------------------------------------- TableInfo


@pytest.mark.parametrize("split", [RowSplit.HASH, RowSplit.RANGE])
@pytest.mark.parametrize(("rows", "k"), [(10, 1), (10, 3), (11, 4), (12, 4), (4, 3), (7, 7)])
def test_every_id_maps_to_one_shard_and_back(split: RowSplit, rows: int, k: int) -> None:
    layout = layouts.row_wise("t", "c", range(k), split)
    table = TableInfo(name="t", num_rows=rows, dim=4, layout=layout)
    ids = torch.arange(rows)
    shard, local = table.split(ids)
    assert shard.min() >= 0 and shard.max() < k
    for i in range(k):
        owned = table.global_rows(i)
        assert owned.numel() == layout.shard_rows(i, rows)
        assert torch.equal(owned[local[shard == i]], ids[shard == i])  # back to the same ID
        assert torch.equal(local[shard == i].sort().values, torch.arange(owned.numel()))
    # the shards partition the table
    everything = torch.cat([table.global_rows(i) for i in range(k)])
    assert torch.equal(everything.sort().values, ids)


def test_hash_and_range_splits_place_ids_as_documented() -> None:
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9])
    hashed = TableInfo(name="t", num_rows=10, dim=4, layout=layouts.row_wise("t", "c", range(3)))
    shard, local = hashed.split(ids)
    assert shard.tolist() == [0, 1, 2, 0, 1, 2, 0, 0]  # id % 3
    assert local.tolist() == [0, 0, 0, 1, 1, 1, 2, 3]  # id // 3
    ranged = TableInfo(
        name="t", num_rows=10, dim=4, layout=layouts.row_wise("t", "c", range(3), RowSplit.RANGE)
    )
    shard, local = ranged.split(ids)  # [0, 4), [4, 7), [7, 10)
    assert shard.tolist() == [0, 0, 0, 0, 1, 1, 1, 2]
    assert local.tolist() == [0, 1, 2, 3, 0, 1, 2, 2]
    assert ranged.global_rows(2).tolist() == [7, 8, 9]
    assert hashed.global_rows(2).tolist() == [2, 5, 8]


def test_one_row_shard_keeps_ids_and_accepts_int32() -> None:
    table = TableInfo(name="t", num_rows=5, dim=4, layout=layouts.table_wise("t", "c", 0))
    ids = torch.tensor([4, 0, 4], dtype=torch.int32)
    shard, local = table.split(ids)
    assert shard.tolist() == [0, 0, 0] and torch.equal(local, ids)
    assert table.global_rows(0).tolist() == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------- blocks


def test_blocks_are_placed_per_owner_in_table_replica_block_order() -> None:
    routes = _routes(
        RB,
        4,
        [
            (layouts.grid("g", "c", [[0, 1], [2, 0]], RowSplit.RANGE), 11, 8),
            (layouts.replicated("r", "c", [[2], [0]]), 5, 4),
        ],
    )
    summary = [
        [
            (b.table, b.replica, b.row_shard, b.col_shard, b.num_rows, b.col_start, b.col_end)
            for b in bl
        ]
        for bl in routes.blocks
    ]
    assert summary == [
        # g row 0 col 0, g row 1 col 1 (range split of 11: 6 + 5 rows), r replica 1
        [(0, 0, 0, 0, 6, 0, 4), (0, 0, 1, 1, 5, 4, 8), (1, 1, 0, 0, 5, 0, 4)],
        [(0, 0, 0, 1, 6, 4, 8)],
        [(0, 0, 1, 0, 5, 0, 4), (1, 0, 0, 0, 5, 0, 4)],
        [],
    ]
    assert all(b.width == b.col_end - b.col_start for bl in routes.blocks for b in bl)
    found = routes.block_at(1, 1, 0)
    assert (found.block.owner, found.local) == (0, 2)
    assert routes.block_at(0, 0, 3).local == 1  # g's block (1, 1) is rank 0's second


def test_a_block_outside_the_world_is_refused() -> None:
    with pytest.raises(ConfigError, match="table 't': block on rank 2, outside a world of 2"):
        _routes(RB, 2, [(layouts.row_wise("t", "c", [0, 2]), 4, 4)])


# ----------------------------------------------------------------- requests


def _two_table_routes(cluster: ClusterPlan) -> ClusterRoutes:
    """``a``: 2 x 2 grid, blocks 0 and 2 on rank 0, 1 and 3 on rank 1; ``b``: row-wise on
    ranks 1, 0; features fa, fb, fa2 (fa2 reads a again)."""
    return _routes(
        cluster,
        2,
        [
            (layouts.grid("a", "c", [[0, 1], [0, 1]]), 9, 8),
            (layouts.row_wise("b", "c", [1, 0]), 7, 4),
        ],
        [("fa", "a"), ("fb", "b"), ("fa2", "a")],
    )


def _order(routes: ClusterRoutes, q: int, p: int) -> list[tuple[int, int, int, int]]:
    """(slot, table, block index i * c + j, local) of each request from q to p."""
    out = []
    for r in routes.requests(q, p):
        b = r.block
        c = routes.tables[b.table].layout.num_col_shards
        out.append((r.slot, b.table, b.row_shard * c + b.col_shard, r.local))
    return out


def test_rb_requests_go_per_feature_by_slot_then_block_index() -> None:
    routes = _two_table_routes(RB)
    assert routes.slot_table == [0, 1, 0]
    # rank 0 holds a's blocks 0, 2 (locals 0, 1) and b's row shard 1 (local 2)
    assert _order(routes, 1, 0) == [
        (0, 0, 0, 0),
        (0, 0, 2, 1),
        (1, 1, 1, 2),
        (2, 0, 0, 0),
        (2, 0, 2, 1),
    ]
    # rank 1 holds a's blocks 1, 3 (locals 0, 1) and b's row shard 0 (local 2)
    assert _order(routes, 0, 1) == [
        (0, 0, 1, 0),
        (0, 0, 3, 1),
        (1, 1, 0, 2),
        (2, 0, 1, 0),
        (2, 0, 3, 1),
    ]
    # without replicas every requester asks the same blocks
    assert _order(routes, 0, 0) == _order(routes, 1, 0)
    for q in range(2):
        for p in range(2):
            assert all(r.block.owner == p for r in routes.requests(q, p))
            assert all(routes.blocks[p][r.local] is r.block for r in routes.requests(q, p))


def test_ub_requests_go_per_table() -> None:
    routes = _two_table_routes(UB)
    assert routes.slot_table == [0, 1]  # fa and fa2 share one slot: IDs de-duplicated per table
    assert _order(routes, 1, 0) == [(0, 0, 0, 0), (0, 0, 2, 1), (1, 1, 1, 2)]


def test_requesters_ask_their_own_replica_group() -> None:
    routes = _routes(
        RB, 4, [(layouts.replicated("r", "c", [[0, 1], [2, 3]], num_row_shards=2), 8, 4)]
    )
    assert [routes.replica(0, q) for q in range(4)] == [0, 0, 1, 1]
    asked = [[len(routes.requests(q, p)) for p in range(4)] for q in range(4)]
    assert asked == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    assert [r.block.row_shard for r in routes.requests(3, 2) + routes.requests(3, 3)] == [0, 1]


# ----------------------------------------------------------------- sync pairs


def test_replicated_blocks_pair_with_their_copies_in_the_other_groups() -> None:
    # rank 2 holds a table-wise table first, so the replica's local index there is 1
    routes = _routes(
        RB,
        4,
        [
            (layouts.table_wise("tw", "c", 2), 3, 4),
            (layouts.replicated("r", "c", [[0, 1], [2, 3]], num_row_shards=2), 8, 4),
        ],
    )
    peers = routes.replicated_peers(2)
    assert len(peers) == 1  # tw is not replicated
    local, block, copies = peers[0]
    assert (local, block.table, block.replica, block.row_shard) == (1, 1, 1, 0)
    assert [(c.owner, c.replica, c.row_shard) for c in copies] == [(0, 0, 0), (2, 1, 0)]
    pairs = [[routes.sync_pairs(a, b) for b in range(4)] for a in range(4)]
    assert pairs == [
        [[], [], [(0, 1)], []],  # rank 0's row shard 0 -> rank 2's local 1
        [[], [], [], [(0, 0)]],
        [[(1, 0)], [], [], []],
        [[], [(0, 0)], [], []],
    ]


def test_no_replicas_no_sync() -> None:
    routes = _two_table_routes(RB)
    assert routes.replicated_peers(0) == [] and routes.sync_pairs(0, 1) == []


def test_column_shards_of_a_row_pair_with_each_other() -> None:
    # grid rows: row 0 on ranks 0, 1; row 1 on ranks 2, 0 (rank 0 holds one block of each row)
    routes = _routes(RB, 3, [(layouts.grid("g", "c", [[0, 1], [2, 0]]), 6, 8)])
    local, block, peers = routes.column_peers(0)[1]
    assert (local, block.row_shard, block.col_shard) == (1, 1, 1)
    assert [(p.owner, p.row_shard, p.col_shard) for p in peers] == [(2, 1, 0), (0, 1, 1)]
    pairs = [[routes.column_pairs(a, b) for b in range(3)] for a in range(3)]
    assert pairs == [
        [[], [(0, 0)], [(1, 0)]],  # row 0 col 0 -> rank 1; row 1 col 1 -> rank 2
        [[(0, 0)], [], []],
        [[(0, 1)], [], []],
    ]


def test_column_shards_on_one_rank_pair_with_themselves() -> None:
    routes = _routes(RB, 2, [(layouts.column_wise("cw", "c", [0, 0, 1]), 4, 6)])
    assert routes.column_pairs(0, 0) == [(0, 1), (1, 0)]
    assert routes.column_pairs(0, 1) == [(0, 0), (1, 0)]
    assert routes.column_pairs(1, 0) == [(0, 0), (0, 1)]


# ----------------------------------------------------------------- ID dtype


@pytest.mark.parametrize(
    ("rows", "k", "dtype"),
    [
        (INT32_MAX, 1, torch.int32),  # local rows 0 .. 2**31 - 2 fit
        (INT32_MAX + 1, 1, torch.int64),
        (2**32, 2, torch.int64),  # 2**31 rows per shard: one too many
        (2**32, 3, torch.int32),  # ceil(2**32 / 3) = 1431655766 rows per shard
        (2 * INT32_MAX, 2, torch.int32),  # exactly INT32_MAX per shard
    ],
)
def test_ids_travel_as_int32_while_every_shard_fits(rows: int, k: int, dtype: torch.dtype) -> None:
    routes = _routes(RB, k, [(layouts.row_wise("huge", "c", range(k)), rows, 4)])
    assert routes.id_dtype is dtype


def test_the_largest_shard_of_any_table_decides_the_id_dtype() -> None:
    routes = _routes(
        UB,
        2,
        [
            (layouts.table_wise("small", "c", 0), 10, 4),
            (layouts.row_wise("huge", "c", [0, 1], RowSplit.RANGE), 2**32 + 1, 4),
        ],
    )
    assert routes.id_dtype is torch.int64
