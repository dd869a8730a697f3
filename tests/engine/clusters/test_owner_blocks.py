"""An owner's blocks sorted by how they update, and where each request's answer lies in
the stores' output (fused store's blocks first, then the synced store's)."""

from __future__ import annotations

from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.engine.clusters._owner_blocks import answer_layout, owner_blocks
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType


def _routes() -> ClusterRoutes:
    """On 2 ranks: ``a`` table-wise on rank 0 (8 wide), ``b`` replicated on both (4 wide),
    ``c`` column-split over ranks 0, 1 (two 3-wide halves)."""
    tables = [
        TableInfo(name="a", num_rows=8, dim=8, layout=layouts.table_wise("a", "rb", 0)),
        TableInfo(name="b", num_rows=8, dim=4, layout=layouts.replicated("b", "rb", [[0], [1]])),
        TableInfo(name="c", num_rows=8, dim=6, layout=layouts.column_wise("c", "rb", [0, 1])),
    ]
    features = [FeatureInfo(name=f"f_{t.name}", table=t.name) for t in tables]
    return ClusterRoutes(ClusterPlan(name="rb", type=ClusterType.RB), tables, features, 2)


def test_blocks_that_need_other_ranks_are_synced_and_laid_out_after_the_fused() -> None:
    routes = _routes()
    rowwise = owner_blocks(routes, 0, rowwise=True)
    tables = [routes.tables[b.table].name for b in rowwise.blocks]
    assert sorted(tables) == ["a", "b", "c"]
    local = {name: i for i, name in enumerate(tables)}
    assert rowwise.replicated == [local["b"]]
    assert rowwise.column_split == [local["c"]]
    assert rowwise.synced == sorted([local["b"], local["c"]])
    assert rowwise.fused == [local["a"]]
    assert rowwise.has_sync and rowwise.has_column_sync
    # The fused block's 8 columns first, then the synced ones in order.
    assert rowwise.columns[local["a"]] == 0
    widths = {name: rowwise.blocks[i].width for name, i in local.items()}
    assert widths == {"a": 8, "b": 4, "c": 3}
    synced_starts = [rowwise.columns[i] for i in rowwise.synced]
    assert synced_starts == [8, 8 + rowwise.blocks[rowwise.synced[0]].width]
    assert rowwise.width == 15
    # Without row-wise Adagrad a column-split block needs nothing from its peers.
    plain = owner_blocks(routes, 0, rowwise=False)
    assert plain.column_split == [] and not plain.has_column_sync
    assert plain.synced == [local["b"]]
    assert sorted(plain.fused) == sorted([local["a"], local["c"]])


def test_each_request_answers_in_its_blocks_columns_from_its_start() -> None:
    owned = owner_blocks(_routes(), 0, rowwise=True)
    a, c = owned.fused[0], owned.column_split[0]
    # Requester 0 asks for block a then c; requester 1 for c only.
    incoming = [[a, c], [c]]
    rows = [[5, 5], [2]]
    starts = {(0, 0): 0, (0, 1): 0, (1, 0): 5}
    layout = answer_layout(owned, incoming, rows, starts)
    assert layout.num_cols == owned.width == 15
    assert layout.num_rows == 7
    cut = [
        [(s.row_start, s.row_stop, [(b.start, b.width) for b in s.blocks]) for s in parts]
        for parts in layout.ranks
    ]
    assert cut == [
        [(0, 5, [(0, 8)]), (0, 5, [(owned.columns[c], 3)])],
        [(5, 7, [(owned.columns[c], 3)])],
    ]
