"""Which peer is gone: a killed rank refuses its liveness socket, a rank that said farewell
is not taken for the cause."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_embark.exchange import census, farewell, start_liveness
from lightning_embark.testing import run_gloo_ranks


def _three_ranks(rank: int, world: int) -> None:
    start_liveness(ranks_per_host=2)  # ranks 0, 1 on host 0; rank 2 on host 1
    start_liveness(ranks_per_host=2)  # once per default group: no second gather
    assert census().gone == ()  # every peer answers, busy or not
    dist.barrier()
    if rank == 2:
        os._exit(0)  # dies without a word, as a killed rank does
    if rank == 1:
        farewell()  # ends after a failure of its own, and says so
        os._exit(0)
    deadline = time.monotonic() + 30
    found = census()
    while len(found.gone) + len(found.left) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        found = census()
    assert [p.rank for p in found.gone] == [2] and [p.rank for p in found.left] == [1]
    assert found.gone[0].describe().startswith("rank 2 on host 1 (")
    os._exit(0)  # skip the harness's closing barrier: the peers are gone


@pytest.mark.multiprocess
def test_a_dead_rank_is_gone_and_a_rank_that_said_farewell_left() -> None:
    run_gloo_ranks(_three_ranks, 3)


def _after_the_group(rank: int, world: int, store: str) -> None:
    start_liveness(ranks_per_host=1)
    dist.barrier()
    dist.destroy_process_group()
    # An earlier group's state is not this process's any more: no probe, no farewell to
    # peers of a group that is gone, and no call into torch.distributed without a group.
    assert census().gone == () and census().left == ()
    farewell()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    dist.barrier()


@pytest.mark.multiprocess
def test_liveness_of_a_torn_down_group_is_ignored(tmp_path: Path) -> None:
    """A process that trained, tore its group down and goes on (a test session, a tuner
    running trials in process) calls :func:`farewell` from an error path: it must not ask
    ``torch.distributed`` for a rank it no longer has."""
    run_gloo_ranks(_after_the_group, 2, str(tmp_path / "store"))
