"""The byte counter against analytic volumes, on real gloo ranks."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Sequence

import pytest
import torch
import torch.distributed as dist

from lightning_embark._traffic import traffic
from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.accounting import _sends as sends
from lightning_embark.testing._ranks import rank_context, run_gloo_ranks

WORLD = 4
RANKS_PER_HOST = 2
BATCH = 8
TABLE_DIMS = [16, 8, 32, 8, 24]
TABLE_OWNER = [0, 1, 2, 3, 1]


def table_wise_pooled_all_to_all_bytes(
    *,
    batch_size_per_rank: int,
    table_dims: Sequence[int],
    table_owner: Sequence[int],
    world_size: int,
    element_size: int = 4,
) -> list[list[int]]:
    """Analytic volume of a table-wise pooled-embedding all-to-all (forward).

    Every rank sends, for every table it owns, one pooled vector per sample of
    every other rank's batch: ``sends[src][dst] = B * sum(d_t for t owned by src)``
    elements, and nothing to itself.

    Returns:
        A ``world_size x world_size`` matrix of bytes sent from ``src`` to ``dst``.
    """
    owned_width = [0] * world_size
    for dim, owner in zip(table_dims, table_owner, strict=True):
        owned_width[owner] += dim
    return [
        [
            0 if src == dst else batch_size_per_rank * owned_width[src] * element_size
            for dst in range(world_size)
        ]
        for src in range(world_size)
    ]


def test_ring_and_broadcast_volumes() -> None:
    assert sends.ring_sends(400, 4, 3, 2.0) == [600, 0, 0, 0]
    assert sends.ring_sends(400, 1, 0, 2.0) == [0]
    assert sends.broadcast_sends(10, 3, 1, 1) == [10, 0, 10]
    assert sends.broadcast_sends(10, 3, 0, 1) == [0, 0, 0]
    per_rank = sends.all_to_all_single_sends(torch.zeros(6, 3), [1, 2, 3], 3)
    assert per_rank == [12, 24, 36]


def test_counter_splits_by_host() -> None:
    counter = CommCounter(rank=1, ranks_per_host=2)
    counter.record("x", {0: 10, 1: 99, 2: 5, 3: 7})
    snap = counter.reset()
    assert (snap.intra_host_bytes, snap.inter_host_bytes) == (10, 12)
    assert counter.snapshot().intra_host_bytes == 0


def test_labelled_calls_are_totalled_per_label_too() -> None:
    counter = CommCounter(rank=0, ranks_per_host=1, keep_calls=True)
    counter.record("all_to_all_single", {1: 8}, traffic="towers:ids")
    counter.record("all_to_all_single", {1: 4})
    counter.add_blocked("all_to_all_single", 0.5, traffic="towers:ids")
    snap = counter.reset()
    assert snap.by_collective["all_to_all_single"].inter_host_bytes == 12
    ids = snap.by_traffic["towers:ids"]
    assert (ids.calls, ids.inter_host_bytes, ids.blocked_seconds) == (1, 8, 0.5)
    assert set(snap.to_dict()["by_traffic"]) == {"towers:ids"}
    assert [c.traffic for c in counter.calls] == ["towers:ids", None]


def _labels_per_thread(rank: int, world_size: int, queue: multiprocessing.Queue) -> None:
    # Another thread holds a label while this one issues a collective: it stays unlabelled;
    # the same collective under this thread's own label is counted under it.
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with traffic("dense"):
            entered.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait()
    counter = CommCounter(rank=rank, ranks_per_host=1)
    with counting_collectives(counter):
        x = torch.ones(world_size * 2)
        dist.all_to_all_single(torch.empty_like(x), x)
        with traffic("towers:outputs"):
            dist.all_to_all_single(torch.empty_like(x), x)
    release.set()
    holder.join()
    snap = counter.reset()
    queue.put((rank, {k: (v.calls, v.inter_host_bytes) for k, v in snap.by_traffic.items()}))


@pytest.mark.multiprocess
def test_a_label_belongs_to_the_thread_that_set_it() -> None:
    queue = rank_context().Queue()
    run_gloo_ranks(_labels_per_thread, 2, queue)
    results = dict(queue.get() for _ in range(2))
    assert results == {r: {"towers:outputs": (1, 8)} for r in range(2)}  # 2 floats to the peer


def _table_wise_exchange(rank: int, world_size: int, queue: multiprocessing.Queue) -> None:
    # Each rank pools its owned tables for every rank's batch and sends them home.
    owned = [dim for dim, owner in zip(TABLE_DIMS, TABLE_OWNER, strict=False) if owner == rank]
    width = sum(owned)
    send = torch.randn(BATCH * world_size, width)
    recv_widths = [
        sum(d for d, o in zip(TABLE_DIMS, TABLE_OWNER, strict=False) if o == src)
        for src in range(world_size)
    ]
    counter = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST)
    with counting_collectives(counter):
        # Flattened send buffer: rank-major blocks of BATCH x width.
        outputs = torch.empty(sum(BATCH * w for w in recv_widths))
        work = dist.all_to_all_single(
            outputs,
            send.reshape(-1),
            output_split_sizes=[BATCH * w for w in recv_widths],
            input_split_sizes=[BATCH * width] * world_size,
            async_op=True,
        )
        work.wait()
    snap = counter.reset()
    queue.put(
        (
            rank,
            snap.intra_host_bytes,
            snap.inter_host_bytes,
            snap.by_collective["all_to_all_single"].calls,
        )
    )


@pytest.mark.multiprocess
def test_table_wise_all_to_all_matches_analytic_volume() -> None:
    queue = rank_context().Queue()
    run_gloo_ranks(_table_wise_exchange, WORLD, queue)
    measured = {
        r: (intra, inter, calls) for r, intra, inter, calls in (queue.get() for _ in range(WORLD))
    }
    analytic = table_wise_pooled_all_to_all_bytes(
        batch_size_per_rank=BATCH, table_dims=TABLE_DIMS, table_owner=TABLE_OWNER, world_size=WORLD
    )
    for src in range(WORLD):
        intra = sum(
            b
            for dst, b in enumerate(analytic[src])
            if dst // RANKS_PER_HOST == src // RANKS_PER_HOST
        )
        inter = sum(
            b
            for dst, b in enumerate(analytic[src])
            if dst // RANKS_PER_HOST != src // RANKS_PER_HOST
        )
        assert measured[src] == (intra, inter, 1)
        assert inter > 0


def _torchrec_table_wise(rank: int, world_size: int, queue: multiprocessing.Queue) -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.types import Topology as PlannerTopology

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=d, num_embeddings=50, feature_names=[f"f{i}"]
        )
        for i, d in enumerate(TABLE_DIMS)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    planner = EmbeddingShardingPlanner(
        topology=PlannerTopology(
            world_size=world_size, compute_device="cpu", local_world_size=RANKS_PER_HOST
        ),
        constraints={
            f"t{i}": ParameterConstraints(sharding_types=["table_wise"])
            for i in range(len(tables))
        },
    )
    plan = planner.collective_plan(ebc, None, dist.GroupMember.WORLD)
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan)
    owners = []
    for i in range(len(tables)):
        param_plan = plan.get_plan_for_module("")[f"t{i}"]
        owners.append(param_plan.ranks[0])
    generator = torch.Generator().manual_seed(rank)
    lengths = torch.randint(0, 3, (len(tables) * BATCH,), generator=generator)
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=generator)
    kjt = KeyedJaggedTensor(
        keys=[f"f{i}" for i in range(len(tables))], values=values, lengths=lengths
    )
    counter = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST, keep_calls=True)
    with counting_collectives(counter), torch.no_grad():
        model(kjt).values()
    snap = counter.reset()
    pooled = [
        c.sends
        for c in counter.calls
        if c.name == "all_to_all_single" and c.dtype == torch.float32
    ]
    queue.put((rank, owners, snap.to_dict(), pooled))


@pytest.mark.multiprocess
def test_torchrec_table_wise_output_dist_matches_analytic_volume() -> None:
    queue = rank_context().Queue()
    run_gloo_ranks(_torchrec_table_wise, WORLD, queue)
    results = {
        r: (owners, snap, pooled)
        for r, owners, snap, pooled in (queue.get() for _ in range(WORLD))
    }
    owners = results[0][0]
    assert len(set(owners)) > 1, "the planner should spread tables over ranks"
    analytic = table_wise_pooled_all_to_all_bytes(
        batch_size_per_rank=BATCH, table_dims=TABLE_DIMS, table_owner=owners, world_size=WORLD
    )
    for src, (_, snap, pooled_calls) in results.items():
        # The pooled-embedding all-to-all is the forward pass's only float32 traffic;
        # torchrec's input distribution (IDs, lengths, splits) is integer traffic on top.
        assert len(pooled_calls) == 1
        sends = pooled_calls[0]
        expected = {dst: b for dst, b in enumerate(analytic[src]) if b}
        assert {dst: b for dst, b in sends.items() if dst != src and b} == expected
        total = snap["intra_host"] + snap["inter_host"]
        assert total > sum(analytic[src]) or sum(analytic[src]) == 0
