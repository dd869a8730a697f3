"""Which peer is gone: a killed rank refuses its liveness socket, a rank that said farewell
is not taken for the cause."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_embark.exchange import _liveness, census, farewell, start_liveness
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


def test_a_peer_whose_socket_closes_a_moment_late_is_still_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dying process's descriptors close one by one: its connections can reset (the
    failure that made this rank probe) before its liveness socket closes. A census where
    every peer answers probes again (up to ``PROBE_ROUNDS``) before it says none is gone."""
    peers = [
        _liveness.Peer(rank=r, host=r // 2, hostname="h", address="127.0.0.1", port=1)
        for r in range(3)
    ]
    state = _liveness._Liveness(group=None, listener=None, peers=peers)  # type: ignore[arg-type]
    probes: list[int] = []

    def answers(peer: _liveness.Peer) -> bool:
        probes.append(peer.rank)
        return not (peer.rank == 1 and len(probes) > 2)  # rank 1 closes after round 1

    monkeypatch.setattr(_liveness, "_current", lambda: state)
    monkeypatch.setattr(_liveness, "_answers", answers)
    monkeypatch.setattr(_liveness, "_read_farewells", lambda listener: set())
    monkeypatch.setattr(_liveness, "PROBE_AGAIN_S", 0.0)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    found = census()
    assert [p.rank for p in found.gone] == [1] and probes == [1, 2, 1, 2]
    probes.clear()
    monkeypatch.setattr(_liveness, "_answers", lambda peer: probes.append(peer.rank) or True)
    assert census().gone == () and probes == [1, 2] * _liveness.PROBE_ROUNDS
