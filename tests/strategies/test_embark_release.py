"""A process that trains model after model (``embark-tune``'s ranks): each run's threads and
process groups go with it.

Ten runs of ``strategy="embark"`` (the default overlapped lane and input pipeline, a
hierarchical plan over 2 hosts of 1 rank, so every kind of group the strategy makes is
made) in one process per rank, each followed by ``release()``. After each run the rank
counts its open sockets (``/proc/self/fd``) and its threads (``/proc/self/task``: gloo's
own threads included, not only Python's). A gloo group keeps at least one socket per peer
and two worker threads plus a transport thread, so one group left per run would add that
much per run; the counts must stay what the first run left.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from typing import Any

import pytest
from torch.utils.data import DataLoader

from lightning_embark.models import DLRMModule
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan
from lightning_embark.registry import register_strategies
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer, rank_context, run_gloo_ranks

RUNS = 10


def _plan(world: int) -> Plan:
    """One table in each kind of cluster, the RB and UB ones hierarchical (1 rank per host)."""
    return Plan(
        world_size=world,
        ranks_per_host=1,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=True),
            ClusterPlan(name="ub", type=ClusterType.UB, hierarchical=True),
        ),
        tables=(
            layouts.table_wise("f0", "rb", world - 1),
            layouts.column_wise("f1", "rb", range(world)),
            layouts.row_wise("f2", "ub", range(world)),
            layouts.data_parallel("f3", "dp", world),
        ),
    )


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def _settled_counts() -> tuple[int, int]:
    """(sockets, threads) once they stop falling: gloo closes a destroyed group's
    connections and joins its threads asynchronously."""
    gc.collect()  # a group in a reference cycle is garbage, not a leak: count what lives
    counts = (_open_sockets(), len(os.listdir("/proc/self/task")))
    for _ in range(20):
        time.sleep(0.05)
        now = (_open_sockets(), len(os.listdir("/proc/self/task")))
        if now == counts:
            break
        counts = now
    return counts


def _runs(rank: int, world: int, synthetic: Any, queue: Any) -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=60, dim=4)
    batches = synthetic.synthetic_batches(spec, num_batches=1, batch_size=8, seed=rank)
    counts = []
    for _ in range(RUNS):
        model = DLRMModule(spec, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
        strategy = EmbarkStrategy(plan=_plan(world), dense_exchange="hierarchical")
        trainer = quiet_trainer(
            strategy=strategy, devices=world, max_steps=1, use_distributed_sampler=False
        )
        trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
        modules = list(strategy.sharded_modules.values())
        assert modules and all(m.overlapped and m.pipelined for m in modules)
        strategy.release()
        del trainer, strategy, model, modules
        counts.append(_settled_counts())
    queue.put((rank, counts))


@pytest.mark.multiprocess
def test_ten_runs_in_one_process_leave_no_sockets_or_threads_behind(synthetic: Any) -> None:
    queue = rank_context().Queue()
    run_gloo_ranks(_runs, 2, synthetic, queue)
    for _ in range(2):
        rank, counts = queue.get()
        sockets = [s for s, _ in counts]
        threads = [t for _, t in counts]
        assert max(sockets) <= sockets[0], (rank, sockets)
        assert max(threads) <= threads[0], (rank, threads)
