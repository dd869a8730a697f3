"""The collective lane: clusters' exchanges run in order on a worker, with the same bits.

A module with ``overlap=True`` runs the same arithmetic on the same values as one without
(only the thread that issues the exchanges, and when, differ), so outputs and every
block's weights must be *equal*, not close, at every step, with three clusters (RB
hierarchical fp16, UB weighted, DP) so that every kind of exchange overlaps another
cluster's work, and with towers. Every other step compares weights only after the next
forward, which must wait for the previous backward's updates (left running on the lane)
by itself. :class:`Lane` itself is checked in one process: order, one worker thread,
traffic labels carried over, errors at the waiter, inline mode, restart after close.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark._traffic import current_traffic, traffic
from lightning_embark.engine import EngineConfig
from lightning_embark.engine._lane import Lane, Pending, tensors_in
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._pipeline import InputPipeline
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import is_peer_failure
from lightning_embark.plan import ClusterPlan, ClusterType, Compression
from lightning_embark.testing import Scenario, all_layouts_plan, random_batches, run_gloo_ranks
from lightning_embark.testing._tower_scenarios import towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

STEPS = 6
BATCH = 5
#: Tables of the RB scenario moved to a UB cluster of their own.
UB_TABLES = ("tw", "cw", "pair")


def _three_clusters(world: int, *, weighted: bool) -> Scenario:
    """RB (hierarchical, fp16) + UB (fp32) + DP clusters over every layout."""
    scenario = all_layouts_plan(
        world,
        2,
        "rb",
        forward=Compression.FP16,
        backward=Compression.FP16,
        hierarchical=True,
        weighted=weighted,
    )
    plan = scenario.plan
    moved = tuple(
        dataclasses.replace(t, cluster="unique") if t.table in UB_TABLES else t
        for t in plan.tables
    )
    assert sum(t.cluster == "unique" for t in moved) == len(UB_TABLES)
    plan = dataclasses.replace(
        plan,
        clusters=(*plan.clusters, ClusterPlan(name="unique", type=ClusterType.UB)),
        tables=moved,
    )
    return dataclasses.replace(scenario, plan=plan)


def _modules(
    world: int, *, weighted: bool, pipeline: bool
) -> tuple[Scenario, ShardedEmbeddingBagCollection, ShardedEmbeddingBagCollection]:
    scenario = _three_clusters(world, weighted=weighted)
    torch.manual_seed(7)
    ebc = EmbeddingBagCollection(tables=scenario.tables, is_weighted=weighted)
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.05)
    plain = ShardedEmbeddingBagCollection.from_ebc(
        ebc,
        scenario.plan,
        sparse_optimizer=optimizer,
        config=EngineConfig(pipeline=False, overlap=False),
    )
    overlapped = ShardedEmbeddingBagCollection.from_ebc(
        ebc,
        scenario.plan,
        sparse_optimizer=optimizer,
        config=EngineConfig(overlap=True, pipeline=pipeline),
    )
    return scenario, plain, overlapped


def _same_steps(rank: int, world: int) -> None:
    """Six training steps (and a no-grad lookup) with and without overlap, unweighted with
    the input pipeline on, weighted without it."""
    for weighted, pipeline in ((False, True), (True, False)):
        scenario, plain, overlapped = _modules(world, weighted=weighted, pipeline=pipeline)
        assert overlapped.overlapped and not plain.overlapped
        sizes = [BATCH] * world
        sizes[1] = 0  # a rank with no samples still takes part in every exchange
        batches = [
            random_batches(scenario, sizes, seed=step, weighted=weighted)[rank]
            for step in range(STEPS)
        ]
        for step, batch in enumerate(batches):
            if pipeline:
                overlapped.prefetch(batch)
            upstream = torch.randn(
                sizes[rank],
                sum(plain.output_dims),
                generator=torch.Generator().manual_seed(step),
            )
            expected = plain(batch).values()
            actual = overlapped(batch).values()
            assert torch.equal(actual, expected), f"step {step}: outputs differ"
            (expected * upstream).sum().backward()
            (actual * upstream).sum().backward()
            if step % 2 == 0:
                continue  # the next forward must wait for the updates by itself
            for a, b in zip(plain.local_shards(), overlapped.local_shards(), strict=True):
                assert torch.equal(a.weight, b.weight), f"step {step}: weights of {a} differ"
                if a.optimizer_state is not None:
                    assert b.optimizer_state is not None
                    assert torch.equal(a.optimizer_state, b.optimizer_state)
        other = random_batches(scenario, [BATCH] * world, seed=99, weighted=weighted)[rank]
        with torch.no_grad():
            assert torch.equal(overlapped(other).values(), plain(other).values())
        assert "embark-lane" in {t.name for t in threading.enumerate()}  # it ran there
        overlapped.close()
        assert "embark-lane" not in {t.name for t in threading.enumerate()}


def _bad_batch_then_good(rank: int, world: int) -> None:
    """A rank whose batch has an out-of-range ID: every rank raises, naming the cause, with
    nothing left in flight on the lane, and the next (good) step gives the plain module's
    bits."""
    scenario, plain, overlapped = _modules(world, weighted=False, pipeline=False)
    batch = random_batches(scenario, [BATCH] * world, seed=3)[rank]
    bad = batch
    if rank == 1:
        values = batch.values().clone()
        values[0] = 10**6
        bad = KeyedJaggedTensor(
            keys=batch.keys(), values=values, lengths=batch.lengths(), stride=batch.stride()
        )
    expected = "out of range" if rank == 1 else r"rank\(s\) \[1\] rejected"
    with pytest.raises(ConfigError, match=expected):
        overlapped(bad)
    assert torch.equal(overlapped(batch).values(), plain(batch).values())
    overlapped(batch).values().sum().backward()
    plain(batch).values().sum().backward()
    for a, b in zip(plain.local_shards(), overlapped.local_shards(), strict=True):
        assert torch.equal(a.weight, b.weight)


def _towers_same_steps(rank: int, world: int) -> None:
    """Projection towers on both hosts' ranks (an inner module with a lane of its own) and
    flat tables: the same bits with and without overlap, tower modules included."""
    scenario = towers_plan(world, 2, module="projection", output_dim=6, hierarchical=True)
    torch.manual_seed(1234)
    ebc = EmbeddingBagCollection(tables=scenario.tables)
    optimizer = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.05)
    modules = [
        ShardedEmbeddingBagCollection.from_ebc(
            ebc,
            scenario.plan,
            sparse_optimizer=optimizer,
            config=EngineConfig(overlap=overlap, pipeline=False),
        )
        for overlap in (False, True)
    ]
    # The same (rank 0's) tower modules in both: each drew its own at construction.
    modules[1].towers.load_state_dict(modules[0].towers.state_dict())
    dense = [torch.optim.SGD(m.towers.parameters(), lr=0.05) for m in modules]
    for step in range(STEPS):
        batch = random_batches(scenario, [BATCH] * world, seed=step)[rank]
        outs = [m(batch).values() for m in modules]
        assert torch.equal(outs[1], outs[0]), f"step {step}: outputs differ"
        upstream = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(step))
        for out, sgd in zip(outs, dense, strict=True):
            (out * upstream).sum().backward()
            sgd.step()
            sgd.zero_grad()
    for a, b in zip(modules[0].local_shards(), modules[1].local_shards(), strict=True):
        assert torch.equal(a.weight, b.weight), f"weights of {a.table} differ"
    for m in modules:
        m.sync_tower_modules()
    for p, q in zip(modules[0].towers.parameters(), modules[1].towers.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.multiprocess
def test_overlapped_towers_are_bit_identical() -> None:
    run_gloo_ranks(_towers_same_steps, 4)


@pytest.mark.multiprocess
def test_overlapped_steps_are_bit_identical() -> None:
    run_gloo_ranks(_same_steps, 4)


@pytest.mark.multiprocess
def test_a_bad_batch_raises_on_every_rank_and_the_next_step_runs() -> None:
    run_gloo_ranks(_bad_batch_then_good, 4)


def test_work_runs_in_order_on_one_worker_with_the_submitters_labels() -> None:
    lane = Lane(torch.device("cpu"), overlap=True)
    gate = threading.Event()
    seen: list[tuple[int, str, str | None]] = []

    def work(i: int) -> int:
        if i == 0:
            gate.wait(5)  # the later work must still run after this one
        seen.append((i, threading.current_thread().name, current_traffic()))
        return 10 * i

    with traffic("outer"):
        first = lane.start(lambda: work(0))
    with traffic("inner"):
        second = lane.start(lambda: work(1))
    assert seen == []  # both wait behind the gate: start() returned at once
    gate.set()
    assert (second.wait(), first.wait()) == (10, 0)
    assert seen == [(0, "embark-lane", "outer"), (1, "embark-lane", "inner")]
    assert current_traffic() is None
    lane.close()
    assert "embark-lane" not in {t.name for t in threading.enumerate()}
    assert lane.run(lambda: threading.current_thread().name) == "embark-lane"  # restarted
    lane.close()


def test_an_error_reaches_the_waiter_and_drain_waits_for_everything() -> None:
    lane = Lane(torch.device("cpu"), overlap=True)
    done: list[int] = []

    def fail() -> None:
        raise RuntimeError("peer 3 died")

    failing = lane.start(fail)
    later = lane.start(lambda: done.append(1))
    lane.drain()
    assert done == [1]
    with pytest.raises(RuntimeError, match="peer 3 died"):
        failing.wait()
    later.wait()
    lane.close()


GLOO_CLOSED = "[pair.cc:553] Connection closed by peer [10.77.0.2]:41234"


def test_after_a_peer_failure_the_lane_runs_nothing_more() -> None:
    """A job that failed because of a peer may have left collectives unissued: no later job
    may issue one (gloo would pair it with a peer's earlier one). Every later job fails with
    that failure, as a peer failure; a closed lane starts anew. A rejected batch (raised on
    every rank alike) does not stop the lane."""
    lane = Lane(torch.device("cpu"), overlap=True)
    ran: list[str] = []

    def rejected() -> None:
        raise ConfigError("rank 1 rejected its batch")

    def dead_peer() -> None:
        raise RuntimeError(GLOO_CLOSED)

    first = lane.start(rejected)
    after_rejected = lane.start(lambda: ran.append("after rejected"))
    failing = lane.start(dead_peer)
    later = lane.start(lambda: ran.append("after the peer failed"))
    lane.drain()
    with pytest.raises(ConfigError):
        first.wait()
    after_rejected.wait()
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        failing.wait()
    with pytest.raises(RuntimeError, match="not run: an earlier collective") as info:
        later.wait()
    assert is_peer_failure(info.value) and isinstance(info.value.__cause__, RuntimeError)
    assert ran == ["after rejected"]
    lane.close()
    assert lane.run(lambda: "a new worker") == "a new worker"
    lane.close()


def test_closing_without_waiting_leaves_blocked_work_to_the_worker() -> None:
    """After an error a rank must not wait for work blocked on a live peer (that peer may
    wait for this rank elsewhere): ``close(wait=False)`` returns while the job is blocked,
    and the worker ends once the job returns; a later start runs on a new worker."""
    lane = Lane(torch.device("cpu"), overlap=True, name="embark-lane-abandoned")
    release = threading.Event()
    blocked = lane.start(release.wait)
    lane.close(wait=False)  # returns at once: the job still waits
    workers = [t for t in threading.enumerate() if t.name == "embark-lane-abandoned"]
    assert len(workers) == 1 and workers[0].is_alive() and workers[0].daemon
    release.set()
    assert blocked.wait() is True
    workers[0].join(timeout=30)
    assert not workers[0].is_alive()
    assert lane.run(lambda: "a new worker") == "a new worker"
    lane.close()


def test_inline_lane_runs_on_the_caller() -> None:
    lane = Lane(torch.device("cpu"), overlap=False)
    pending = lane.start(lambda: threading.current_thread().name)
    assert pending.wait() == threading.current_thread().name
    assert Pending.done(3).wait() == 3
    with pytest.raises(ZeroDivisionError):
        lane.start(lambda: 1 // 0)
    lane.close()


def test_tensors_in_walks_what_a_distribution_holds() -> None:
    @dataclass
    class Holder:
        bags: list[torch.Tensor]
        extra: dict[str, object]

    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    found = list(tensors_in([Holder(bags=[a, b], extra={"x": (c, 3, "s")}), None]))
    assert [t is x for t, x in zip(found, (a, b, c), strict=True)] == [True] * 3


class _FakeCuda:
    """Just enough of ``torch.cuda`` for a lane on ``cuda:1`` without a GPU: it logs, per
    thread, the current device set, the streams entered and each stream's waits."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.current: dict[str, object] = {}
        fake = self

        class Stream:
            def __init__(self, device: torch.device | None = None) -> None:
                self.name = f"side({device})"

            def wait_event(self, event: Event) -> None:
                fake.log.append(
                    (threading.current_thread().name, f"{self.name} waits", event.name)
                )

        class Event:
            def __init__(self) -> None:
                self.name = "?"

            def record(self, stream: Stream) -> None:
                self.name = f"event on {stream.name}"

        self.Stream, self.Event = Stream, Event
        self.main = Stream()
        self.main.name = "current"

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self

        @contextmanager
        def stream(side: object) -> Iterator[None]:
            fake.log.append((threading.current_thread().name, f"in {side.name}"))  # type: ignore[attr-defined]
            yield

        def set_device(device: torch.device) -> None:
            fake.log.append((threading.current_thread().name, f"set_device {device}"))

        monkeypatch.setattr(torch.cuda, "Stream", self.Stream)
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "set_device", set_device)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.main)


@pytest.mark.parametrize("kind", ["lane", "input pipeline"])
def test_a_cuda_worker_makes_the_engines_device_its_own(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The current CUDA device is per thread, and a new thread's is device 0: the engine's
    worker threads (its lane, its input pipeline's) set the engine's device before any work,
    and then run it on their side stream after it waited for the submitter's stream; the
    waiter's stream waits for the work (a fake ``torch.cuda``: no GPU here)."""
    fake = _FakeCuda()
    fake.install(monkeypatch)
    device = torch.device("cuda", 1)
    key = torch.zeros(1)
    if kind == "lane":
        lane = Lane(device, overlap=True, name="worker")
        result = lane.start(lambda: threading.current_thread().name).wait()
        lane.close()
    else:
        pipeline: InputPipeline[str] = InputPipeline(device)
        pipeline.submit(key, lambda: threading.current_thread().name)
        result = pipeline.take(key)
        pipeline.close()
    worker = "worker" if kind == "lane" else "embark-input"
    side = "side(cuda:1)"
    assert result == worker
    assert fake.log == [
        (worker, "set_device cuda:1"),
        (worker, f"in {side}"),
        (worker, f"{side} waits", "event on current"),
        ("MainThread", "current waits", f"event on {side}"),
    ]
