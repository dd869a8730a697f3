"""The UB requester's local work: de-duplication, pooling from unique rows, per-unique-row
gradients."""

from __future__ import annotations

import torch

from lightning_embark.engine.clusters._ub import dedupe, pool_unique, shard_order, unique_row_grads


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


def test_shard_order_groups_unique_ids_by_row_shard_and_keeps_every_lookup() -> None:
    """The requester regroups a table's unique IDs by row shard (hash split here), so each
    request's rows are one run; every feature's inverse must still find its own ID."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randint(40, (15,), generator=gen), torch.randint(40, (9,), generator=gen)
    unique, inverse = dedupe([a, b])
    shard = unique % 3
    order, regrouped, counts = shard_order(shard, inverse, 3)
    assert counts == [int((shard == i).sum()) for i in range(3)]
    assert torch.equal(shard[order], shard.sort(stable=True).values)  # runs of shard 0, 1, 2
    for ids, inv in zip((a, b), regrouped, strict=True):
        assert torch.equal(unique[order][inv], ids)
    nothing = torch.zeros(0, dtype=torch.int64)
    empty_order, empty_inverse, empty_counts = shard_order(nothing, [nothing], 2)
    assert empty_order.numel() == 0 and empty_inverse[0].numel() == 0 and empty_counts == [0, 0]
