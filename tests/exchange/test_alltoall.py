"""Flat and hierarchical all-to-all deliver the same rows; the hierarchy's routing is as
documented."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.exchange._alltoall import (
    FlatAllToAll,
    HierarchicalAllToAll,
    make_exchange,
)
from lightning_embark.exchange._hierarchy import hierarchy_groups
from lightning_embark.testing._ranks import run_gloo_ranks

RANKS_PER_HOST = 2


def _rows(src: int, dst: int, n: int, width: int) -> torch.Tensor:
    """Rows that say where they come from and go to."""
    base = torch.tensor([src, dst], dtype=torch.float32).expand(n, 2)
    return torch.cat(
        [base, torch.arange(n, dtype=torch.float32).unsqueeze(1).expand(n, width - 2)], dim=1
    )


def _exchange(rank: int, world: int) -> None:
    hierarchical = HierarchicalAllToAll(RANKS_PER_HOST)
    assert hierarchy_groups(RANKS_PER_HOST) == (
        hierarchical.host_group,
        hierarchical.local_group,
    )  # built once
    flat = FlatAllToAll()
    assert isinstance(
        make_exchange(hierarchical=True, ranks_per_host=world), FlatAllToAll
    )  # one host
    for trial in range(3):
        counts = torch.randint(
            0, 4, (world, world), generator=torch.Generator().manual_seed(trial)
        )
        counts[trial % world] = 0  # a rank that sends nothing
        send = torch.cat([_rows(rank, p, int(counts[rank, p]), 4) for p in range(world)])
        expected = torch.cat([_rows(q, rank, int(counts[q, rank]), 4) for q in range(world)])
        for exchange in (flat, hierarchical):
            for known in (None, counts[:, rank].tolist()):
                got, recv = exchange(send, counts[rank].tolist(), known)
                assert torch.equal(got, expected), (type(exchange).__name__, known)
                assert recv == counts[:, rank].tolist()
        ids = torch.arange(int(counts[rank].sum()), dtype=torch.int32)  # 1-D, another dtype
        got, _ = hierarchical(ids, counts[rank].tolist(), counts[:, rank].tolist())
        assert got.dtype == torch.int32 and got.numel() == int(counts[:, rank].sum())
    # Cross-host traffic flows only between ranks with the same local rank.
    counter = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST, keep_calls=True)
    counts = torch.full((world, world), 3)
    send = torch.cat([_rows(rank, p, 3, 4) for p in range(world)])
    with counting_collectives(counter):
        hierarchical(send, counts[rank].tolist(), counts[:, rank].tolist())
    for call in counter.calls:
        for peer, num_bytes in call.sends.items():
            if num_bytes and peer // RANKS_PER_HOST != rank // RANKS_PER_HOST:
                assert peer % RANKS_PER_HOST == rank % RANKS_PER_HOST


@pytest.mark.multiprocess
def test_hierarchical_matches_flat_on_two_hosts() -> None:
    run_gloo_ranks(_exchange, 4)


@pytest.mark.parametrize("shape", [(), (3,)])
def test_regroup_reorders_runs_from_outer_inner_to_inner_outer(shape: tuple[int, ...]) -> None:
    from lightning_embark.exchange._alltoall import _regroup

    counts = [2, 0, 1, 3, 1, 2]  # runs (o, i) for o in 0..2, i in 0..1
    run_of = torch.repeat_interleave(torch.arange(6), torch.tensor(counts))
    rows = run_of.to(torch.uint8).reshape(-1, *([1] * len(shape))).expand(-1, *shape).contiguous()
    got = _regroup(rows, counts, 3, 2)
    order = [o * 2 + i for i in range(2) for o in range(3)]
    want = torch.cat([rows[run_of == r] for r in order])
    assert torch.equal(got, want) and got.dtype == torch.uint8
    assert _regroup(rows, counts, 6, 1) is rows  # one run per group: nothing to move


def test_send_counts_are_checked_against_the_rows_given() -> None:
    from lightning_embark.errors import ConfigError
    from lightning_embark.exchange._alltoall import _check_send

    rows = torch.zeros(5, 2)
    assert _check_send(rows, [2, 0, 3, 0], 4) == [2, 0, 3, 0]
    with pytest.raises(ConfigError, match="sum to 4 but 5 rows"):
        _check_send(rows, [1, 1, 1, 1], 4)
    with pytest.raises(ConfigError, match="4 non-negative row counts"):
        _check_send(rows, [5, 0], 4)


@pytest.mark.multiprocess
def test_hierarchical_matches_flat_on_three_hosts() -> None:
    """A middle host sends its direct rows and its forwarded rows both ways."""
    run_gloo_ranks(_exchange, 6)
