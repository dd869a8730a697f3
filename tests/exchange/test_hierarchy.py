"""The hierarchy's process groups are made once; its cross-host stage sends each direction
on its own connection."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.exchange._hierarchy import hierarchy_groups
from lightning_embark.testing._ranks import run_gloo_ranks


def _rows(src: int, dst: int, n: int, width: int) -> torch.Tensor:
    """Rows that say where they come from and go to."""
    base = torch.tensor([src, dst], dtype=torch.float32).expand(n, 2)
    return torch.cat(
        [base, torch.arange(n, dtype=torch.float32).unsqueeze(1).expand(n, width - 2)], dim=1
    )


def _cross_host(rank: int, world: int) -> None:
    from lightning_embark.exchange import cross_host_rows

    # One rank per host: positions in the same-local-rank group are hosts.
    hierarchy_groups(1)
    counts = torch.tensor([[2, 3, 1], [0, 2, 4], [3, 1, 0]])  # [src, dst]
    send = torch.cat([_rows(rank, p, int(counts[rank, p]), 3) for p in range(world)])
    expected = torch.cat([_rows(q, rank, int(counts[q, rank]), 3) for q in range(world)])
    counter = CommCounter(rank=rank, ranks_per_host=1, keep_calls=True)
    with counting_collectives(counter):
        got = cross_host_rows(send, counts[rank].tolist(), counts[:, rank].tolist(), 1)
    assert torch.equal(got, expected)
    # Each collective sends one way only: to lower hosts, or to this one and higher ones.
    assert len(counter.calls) == 2
    for call in counter.calls:
        peers = [p for p, n in call.sends.items() if n and p != rank]
        assert all(p < rank for p in peers) or all(p > rank for p in peers), call.sends
    sent = {p: n for call in counter.calls for p, n in call.sends.items() if n}
    assert sent == {p: int(counts[rank, p]) * 3 * 4 for p in range(world) if counts[rank, p]}


@pytest.mark.multiprocess
def test_cross_host_rows_sends_each_direction_in_its_own_collective() -> None:
    """Three hosts, so the middle one sends both ways (gloo: one connection per direction)."""
    run_gloo_ranks(_cross_host, 3)
