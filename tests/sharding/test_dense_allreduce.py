"""The host-aware dense-gradient all-reduce: equal to the mean, fewer cross-host bytes."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading

import pytest
import torch
import torch.distributed as dist

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import Compression
from lightning_embark.sharding._dense_allreduce import (
    SerialWorker,
    check_dense_options,
    dense_allreduce_state,
    hierarchical_allreduce,
    release_dense_state,
)
from lightning_embark.testing._ranks import rank_context, run_gloo_ranks

WORLD, RANKS_PER_HOST, NUMEL = 4, 2, 1001


def _grad(rank: int) -> torch.Tensor:
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank))


def _run(rank: int, world_size: int, queue: multiprocessing.Queue) -> None:
    expected = torch.stack([_grad(r) for r in range(world_size)]).mean(0)
    results = {}
    for compression in (Compression.FP32, Compression.BF16):
        state = dense_allreduce_state(ranks_per_host=RANKS_PER_HOST, compression=compression)
        counter = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST)
        grad = _grad(rank)
        with counting_collectives(counter):
            out = hierarchical_allreduce(grad, state)
        assert torch.equal(grad, _grad(rank)), "the input must not be modified"
        error = float((out - expected).abs().max())
        results[compression.value] = (error, counter.snapshot().inter_host_bytes)
    flat = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST)
    with counting_collectives(flat):
        dist.all_reduce(_grad(rank))
    results["flat"] = (0.0, flat.snapshot().inter_host_bytes)
    queue.put(results)


@pytest.mark.multiprocess
def test_hierarchical_allreduce_is_the_mean_and_saves_cross_host_bytes() -> None:
    queue = rank_context().Queue()
    run_gloo_ranks(_run, WORLD, queue)
    results = [queue.get() for _ in range(WORLD)]
    assert max(r["fp32"][0] for r in results) < 1e-6
    assert max(r["bf16"][0] for r in results) < 2e-2
    inter = {name: sum(r[name][1] for r in results) for name in ("flat", "fp32", "bf16")}
    assert inter["fp32"] < inter["flat"]
    assert inter["bf16"] * 2 == pytest.approx(inter["fp32"], rel=0.01)


def test_dense_options_are_checked() -> None:
    assert check_dense_options("flat", "bf16") is Compression.BF16
    with pytest.raises(ConfigError, match="dense_exchange"):
        check_dense_options("ring", "fp32")
    with pytest.raises(ConfigError, match="not supported for dense gradients"):
        check_dense_options("flat", "fp8")


def test_serial_worker_runs_jobs_in_order_off_the_calling_thread() -> None:
    worker = SerialWorker()
    release = threading.Event()
    order: list[int] = []

    def job(i: int) -> torch.Tensor:
        release.wait(timeout=10)
        order.append(i)
        return torch.tensor([float(i)])

    futures = [worker.submit(lambda i=i: job(i)) for i in range(5)]
    assert not any(f.done() for f in futures), (
        "submit must return before the job runs to completion"
    )
    release.set()
    assert [float(f.wait()) for f in futures] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert order == [0, 1, 2, 3, 4]
    worker.close()


def test_serial_worker_hands_errors_to_the_future() -> None:
    def fail() -> torch.Tensor:
        raise RuntimeError("peer died")

    worker = SerialWorker()
    failed = worker.submit(fail)
    with pytest.raises(RuntimeError, match="peer died"):
        failed.wait()
    worker.close()


def test_serial_worker_keeps_no_thread_when_closed_and_starts_one_again() -> None:
    """A process that trains model after model closes the worker after each run: no
    thread (and nothing it holds) may outlive the run, and a later job still runs."""
    before = threading.active_count()
    worker = SerialWorker()
    assert not worker.running and threading.active_count() == before
    assert float(worker.submit(lambda: torch.tensor([1.0])).wait()) == 1.0
    assert worker.running
    worker.close()
    assert not worker.running and threading.active_count() == before
    worker.close()  # closing twice is harmless
    assert float(worker.submit(lambda: torch.tensor([2.0])).wait()) == 2.0
    worker.close()
    assert threading.active_count() == before


def test_serial_worker_runs_nothing_after_a_peer_failure() -> None:
    """As the engine's lane: a bucket whose all-reduce failed because of a peer stops the
    worker; later buckets fail without issuing a collective; a later run starts anew."""
    worker = SerialWorker()
    ran: list[int] = []

    def dead_peer() -> torch.Tensor:
        raise RuntimeError("[pair.cc:553] Connection closed by peer [10.77.0.2]:41234")

    failing = worker.submit(dead_peer)
    later = worker.submit(lambda: ran.append(1) or torch.ones(1))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        failing.wait()
    with pytest.raises(RuntimeError, match="not run: an earlier collective"):
        later.wait()
    assert ran == []
    worker.close()
    assert float(worker.submit(lambda: torch.tensor([2.0])).wait()) == 2.0
    worker.close()


def _open_sockets() -> int:
    return sum(
        1 for fd in os.listdir("/proc/self/fd") if "socket" in _readlink(f"/proc/self/fd/{fd}")
    )


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _build_and_release(rank: int, world_size: int, queue: multiprocessing.Queue) -> None:
    counts = []
    for _ in range(3):
        state = dense_allreduce_state(ranks_per_host=RANKS_PER_HOST, compression=Compression.FP32)
        out = state.worker.submit(lambda state=state: hierarchical_allreduce(_grad(rank), state))
        out.wait()
        release_dense_state(state)
        gc.collect()  # a group in a reference cycle is garbage, not a leak: count what lives
        counts.append(_open_sockets())
    queue.put((counts, state.worker.running))


@pytest.mark.multiprocess
def test_released_state_leaves_no_groups_or_threads() -> None:
    """Three build-use-release rounds: the open sockets (gloo groups) never grow past the
    count of the first round, and no worker thread is left. A leaked group keeps at least
    one socket per peer, so a leak adds sockets every round; a peer's connection to a
    released group may still be closing when a round counts (gloo closes asynchronously),
    so an earlier round may count more than a later one, never fewer."""
    queue = rank_context().Queue()
    run_gloo_ranks(_build_and_release, WORLD, queue)
    for counts, running in (queue.get() for _ in range(WORLD)):
        assert counts[0] >= counts[1] >= counts[2], counts
        assert not running


@pytest.mark.parametrize(
    ("allow", "explicit", "expected"),
    [
        (None, None, Compression.FP32),
        (["fp16", "fp8"], None, Compression.FP32),  # fp16 is never picked on the user's behalf
        (["fp8", "bf16"], None, Compression.BF16),
        (["bf16"], "fp32", Compression.FP32),  # an explicit choice wins
        (None, "fp16", Compression.FP16),
    ],
)
def test_dense_wire_format_follows_allow_unless_given(allow, explicit, expected) -> None:
    from lightning_embark.strategies import EmbarkStrategy

    assert EmbarkStrategy(allow=allow, dense_compression=explicit).dense_compression is expected
