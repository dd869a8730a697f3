"""The layout builders give the documented ``(r, k, c)``, row split and block placement."""

from __future__ import annotations

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, Plan, RowSplit, TableLayout
from lightning_embark.spec import ModelSpec, TableSpec


def _shape(layout: TableLayout) -> tuple[int, int, int]:
    return layout.num_replicas, layout.num_row_shards, layout.num_col_shards


def test_table_wise_puts_the_whole_table_on_one_rank() -> None:
    layout = layouts.table_wise("t", "c", 3)
    assert (layout.table, layout.cluster) == ("t", "c")
    assert _shape(layout) == (1, 1, 1)
    assert layout.ranks == ((3,),)


@pytest.mark.parametrize("split", [RowSplit.HASH, RowSplit.RANGE])
def test_row_wise_has_one_row_shard_per_rank(split: RowSplit) -> None:
    layout = layouts.row_wise("t", "c", range(1, 4), split)
    assert _shape(layout) == (1, 3, 1)
    assert layout.row_split is split
    assert layout.ranks == ((1, 2, 3),)


def test_row_wise_hashes_by_default() -> None:
    assert layouts.row_wise("t", "c", [0, 1]).row_split is RowSplit.HASH


def test_column_wise_has_one_column_shard_per_rank() -> None:
    layout = layouts.column_wise("t", "c", [2, 0])
    assert _shape(layout) == (1, 1, 2)
    assert layout.ranks == ((2, 0),)


def test_grid_places_row_shard_i_column_shard_j_at_block_i_c_plus_j() -> None:
    ranks = [[0, 1, 2], [3, 4, 5]]
    layout = layouts.grid("t", "c", ranks, RowSplit.RANGE)
    assert _shape(layout) == (1, 2, 3)
    assert layout.row_split is RowSplit.RANGE
    for i in range(2):
        for j in range(3):
            assert layout.ranks[0][i * 3 + j] == ranks[i][j]


def test_grid_rows_must_have_the_same_length() -> None:
    with pytest.raises(ConfigError, match=r"table 't': grid rows must all have 2 ranks"):
        layouts.grid("t", "c", [[0, 1], [2]])
    with pytest.raises(ConfigError, match=r"grid rows must all have 1 ranks"):
        layouts.grid("t", "c", [[0], [1, 2]])


@pytest.mark.parametrize(("host", "expected"), [(0, (0, 1, 2)), (2, (6, 7, 8))])
def test_table_row_wise_splits_rows_over_one_hosts_ranks(host: int, expected: tuple) -> None:
    layout = layouts.table_row_wise("t", "c", host, 3, RowSplit.RANGE)
    assert _shape(layout) == (1, 3, 1)
    assert layout.ranks == (expected,)
    assert layout.row_split is RowSplit.RANGE


def test_data_parallel_puts_replica_g_on_rank_g() -> None:
    layout = layouts.data_parallel("t", "dp", 3)
    assert _shape(layout) == (3, 1, 1)
    assert layout.ranks == ((0,), (1,), (2,))


def test_replicated_places_each_groups_blocks() -> None:
    rows = layouts.replicated("t", "c", [[0, 1], [2, 3]], num_row_shards=2, split="range")
    assert _shape(rows) == (2, 2, 1)
    assert rows.ranks == ((0, 1), (2, 3))
    assert rows.row_split is RowSplit.RANGE
    grid = layouts.replicated(
        "t", "c", [[0, 1, 2, 3], [4, 5, 6, 7]], num_row_shards=2, num_col_shards=2
    )
    assert _shape(grid) == (2, 2, 2)
    with pytest.raises(ConfigError, match=r"replica 0 places 2 blocks but k\*c = 1\*1 = 1"):
        layouts.replicated("t", "c", [[0, 1], [2, 3]])


def test_every_builder_validates_in_a_plan() -> None:
    tables = (
        layouts.table_wise("tw", "c", 3),
        layouts.row_wise("rw", "c", range(4)),
        layouts.column_wise("cw", "c", range(4)),
        layouts.grid("g", "c", [[0, 1], [2, 3]]),
        layouts.table_row_wise("trw", "c", 1, 2),
        layouts.replicated("rep", "c", [[0, 1], [2, 3]], num_row_shards=2),
        layouts.data_parallel("dp", "dp", 4),
    )
    spec = ModelSpec(
        name="all",
        tables=tuple(
            TableSpec(name=t.table, num_embeddings=8, embedding_dim=8, pooling_factor=1.0)
            for t in tables
        ),
    )
    plan = Plan(
        world_size=4,
        ranks_per_host=2,
        clusters=(ClusterPlan(name="c", type="rb"), ClusterPlan(name="dp", type="dp")),
        tables=tables,
    )
    plan.validate(spec)
