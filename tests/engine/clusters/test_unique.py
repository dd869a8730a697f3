"""The UB requester's local work: de-duplication, pooling from unique rows, per-unique-row
gradients."""

from __future__ import annotations

import torch

from lightning_embark.accounting import DispatchCounter
from lightning_embark.engine.clusters._unique import (
    dedupe,
    gathered_row_grads,
    pool_unique,
    unique_ids,
    unique_row_grads,
    unique_runs,
)


def test_dedupe_pool_and_gradients_match_a_dense_gather() -> None:
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(50, 6, generator=gen)
    a, b = (
        torch.randint(50, (12,), generator=gen, dtype=torch.int32),
        torch.randint(50, (7,), generator=gen),
    )
    unique, (inv_a, inv_b) = dedupe([a, b])
    assert torch.equal(unique, torch.cat([a.long(), b]).unique())
    assert torch.equal(unique[inv_a], a.long()) and torch.equal(unique[inv_b], b)
    offsets = torch.tensor([0, 3, 3, 8])  # bag starts: 4 bags, one empty
    bag_of = torch.tensor([0, 0, 0, 2, 2, 2, 2, 2, 3, 3, 3, 3])
    weights = torch.rand(12, generator=gen)
    pooled = pool_unique(inv_a, table[unique], offsets, weights)
    dense = torch.zeros(4, 6).index_add_(0, bag_of, table[a.long()] * weights[:, None])
    torch.testing.assert_close(pooled, dense)
    grad = torch.randn(4, 6, generator=gen)
    per_unique = unique_row_grads(unique.numel(), inv_a, bag_of, weights, grad)
    expected = torch.zeros(unique.numel(), 6).index_add_(0, inv_a, grad[bag_of] * weights[:, None])
    torch.testing.assert_close(per_unique, expected)
    assert not per_unique[
        torch.isin(unique, a.long(), invert=True)
    ].any()  # rows only b asked for get nothing
    # The GPU's path (a gather and index_add_) sums the same terms: each row adds at most
    # 12 products of unit-scale fp32 values, so the two orders differ by a few ulps, well
    # inside assert_close's fp32 default (rtol 1.3e-6, atol 1e-5).
    torch.testing.assert_close(
        gathered_row_grads(unique.numel(), inv_a, bag_of, weights, grad), per_unique
    )


def test_unique_runs_equal_each_table_deduplicated_then_grouped_by_shard() -> None:
    """All tables at once (one torch.unique over IDs shifted by their table's offset) gives
    what de-duplicating each table alone and stably sorting its unique IDs by row shard
    gives: the same runs, in table then shard order, and every ID finds its own row."""
    from lightning_embark.engine._routing import TableInfo
    from lightning_embark.plan import RowSplit, layouts

    gen = torch.Generator().manual_seed(1)
    tables = [
        TableInfo(name="a", num_rows=40, dim=4, layout=layouts.row_wise("a", "u", [0, 1, 2])),
        TableInfo(name="b", num_rows=7, dim=4, layout=layouts.table_wise("b", "u", 0)),
        TableInfo(
            name="c", num_rows=30, dim=4, layout=layouts.row_wise("c", "u", [0, 1], RowSplit.RANGE)
        ),
    ]
    ids = [
        torch.randint(t.num_rows, (n,), generator=gen)
        for t, n in zip(tables, (25, 9, 0), strict=True)
    ]
    ids[2] = torch.randint(30, (14,), generator=gen)
    base = torch.tensor([0, 40, 47, 77])
    shifted = torch.cat([i + base[t] for t, i in enumerate(ids)])
    found_runs = unique_runs(shifted, base, tables)
    lengths = found_runs.lengths.tolist()
    local, inverse = unique_ids(found_runs, lengths), found_runs.position
    runs = found_runs.by_shard(lengths, tables)
    expected, start = [], 0
    for t, (table, i) in enumerate(zip(tables, ids, strict=True)):
        unique = i.unique()
        shard, rows = table.split(unique)
        order = torch.argsort(shard, stable=True)
        for s in range(table.layout.num_row_shards):
            run = rows[order][shard[order] == s]
            assert runs[(t, s)] == run.numel()
            expected.append(run)
        # every ID of the table finds its own row again
        found = local[inverse[start : start + i.numel()]]
        assert torch.equal(found, table.split(i)[1])
        start += i.numel()
    assert torch.equal(local, torch.cat(expected))
    counter = DispatchCounter()  # what a GPU would wait for: nothing until the caller's copy
    with counter.counting():
        unique_runs(shifted, base, tables)
    syncs = counter.snapshot().syncs
    assert counter.snapshot().device_syncs == 0, syncs
    empty = unique_runs(torch.zeros(0, dtype=torch.int64), base, tables)
    empty_lengths = empty.lengths.tolist()
    assert unique_ids(empty, empty_lengths).numel() == 0
    assert all(n == 0 for n in empty.by_shard(empty_lengths, tables).values())
