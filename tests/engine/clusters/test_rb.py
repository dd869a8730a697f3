"""RBCluster's pooled layout: where each source's rows land in the ``[B, sum(d)]`` output.

One slice per owner when flat (column offset of the feature plus the block's column
start, one block per request), one per host when partials are reduced inside hosts
(one block per key); cached per batch size and bounded.
"""

from __future__ import annotations

import pytest

from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.engine.clusters import EngineOptions, RBCluster
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, TableLayout
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.wire import codec_for

FP32 = codec_for("fp32", backward=False)
FP8 = codec_for("fp8", backward=False)


def _cluster(
    rank: int,
    world: int,
    tables: list[tuple[TableLayout, int]],
    features: list[str],
    *,
    hierarchical: bool = False,
    ranks_per_host: int = 1,
) -> RBCluster:
    """An RB cluster of ``(layout, dim)`` tables (8 rows each); features name their table."""
    infos = [TableInfo(name=lay.table, num_rows=8, dim=dim, layout=lay) for lay, dim in tables]
    routes = ClusterRoutes(
        ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=hierarchical),
        infos,
        [FeatureInfo(name=f"f{i}", table=t) for i, t in enumerate(features)],
        world,
    )
    options = EngineOptions(
        optimizer=SparseOptimizer(), store="torch", ranks_per_host=ranks_per_host
    )
    return RBCluster(routes, rank, options)


def _blocks(layout, source: int) -> list[tuple[int, int]]:
    return [(b.start, b.width) for b in layout.parts(source)[0].blocks]


def _flat(rank: int, world: int) -> None:
    # a: 8 wide, column-split over ranks 0, 1; b: 4 wide, row-split over ranks 1, 0.
    # Features a, b, a: column offsets 0, 8, 12 in a 20-wide output.
    cluster = _cluster(
        rank,
        world,
        [(layouts.column_wise("a", "rb", [0, 1]), 8), (layouts.row_wise("b", "rb", [1, 0]), 4)],
        ["a", "b", "a"],
    )
    assert cluster.host_reduce is None
    assert (cluster.dims, cluster.offsets) == ([8, 4, 8], [0, 8, 12])
    layout = cluster.pooled_layout(5)
    assert (layout.num_rows, layout.num_cols, len(layout.ranks)) == (5, 20, 2)
    # owner 0 holds a's column 0 and b's row shard 1; owner 1 a's column 1 and b's row shard 0:
    # both of b's row shards land on the same columns (they are reduced on arrival)
    assert _blocks(layout, 0) == [(0, 4), (8, 4), (12, 4)]
    assert _blocks(layout, 1) == [(4, 4), (8, 4), (16, 4)]
    assert all((p.row_start, p.row_stop) == (0, 5) for r in range(2) for p in layout.parts(r))
    assert layout.split_bytes(FP32) == [5 * 3 * 16, 5 * 3 * 16]
    assert layout.split_bytes(FP8) == [5 * 3 * (4 + 4)] * 2  # 4 fp8 bytes + the row's scale
    # cached per batch size ...
    assert cluster.pooled_layout(5) is layout
    for size in range(6, 13):  # 8 sizes cached in all: 5..12
        cluster.pooled_layout(size)
    assert cluster.pooled_layout(5) is layout
    # ... and bounded: a 9th size starts the cache afresh
    cluster.pooled_layout(0)
    again = cluster.pooled_layout(5)
    assert again is not layout and again == layout
    assert cluster.pooled_layout(0).num_rows == 0


@pytest.mark.multiprocess
def test_flat_layout_has_one_slice_per_owner_and_is_cached_and_bounded() -> None:
    run_gloo_ranks(_flat, 2)


def _hierarchical(rank: int, world: int) -> None:
    tables = [
        (layouts.table_row_wise("a", "rb", 0, 2), 4),  # both row shards on host 0
        (layouts.grid("g", "rb", [[0, 2], [1, 3]]), 8),  # host 0: column 0, host 1: column 1
    ]
    reduced = _cluster(rank, world, tables, ["a", "g"], hierarchical=True, ranks_per_host=2)
    assert reduced.host_reduce is not None
    layout = reduced.pooled_layout(3)
    # one slice per host, one block per (feature, column shard) key
    assert (len(layout.ranks), layout.num_cols) == (2, 12)
    assert _blocks(layout, 0) == [(0, 4), (4, 4)]
    assert _blocks(layout, 1) == [(8, 4)]
    assert layout.split_bytes(FP32) == [3 * 2 * 16, 3 * 16]
    # the same plan exchanged flat: one slice per owner, one block per request
    flat = _cluster(rank, world, tables, ["a", "g"], ranks_per_host=2).pooled_layout(3)
    assert [_blocks(flat, p) for p in range(4)] == [
        [(0, 4), (4, 4)],
        [(0, 4), (4, 4)],
        [(8, 4)],
        [(8, 4)],
    ]
    # hierarchical on one rank per host: nothing to reduce inside a host
    single = _cluster(rank, world, tables, ["a", "g"], hierarchical=True, ranks_per_host=1)
    assert single.host_reduce is None and len(single.pooled_layout(3).ranks) == 4


@pytest.mark.multiprocess
def test_reduced_layout_has_one_slice_per_host_and_one_block_per_key() -> None:
    run_gloo_ranks(_hierarchical, 4)
