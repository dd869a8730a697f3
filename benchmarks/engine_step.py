"""The sharded module's forward + backward step on gloo ranks, per cluster type and codec.

Every table layout of the engine's exactness scenario (table-wise, row-wise hash and
range, column-wise, grid, table-row-wise, replicated, a shared table, data-parallel)
in one RB or UB cluster, ``--world`` gloo ranks on this machine (loopback gloo, no
shaping), SGD. It prints each configuration's median step time with p10-p90 over the
timed steps, and the engine's own CPU time per step: a regression check for the
engine's own CPU work (routing, lookups, codec passes), not a cluster benchmark
(``embark-bench`` is that). Run it twice, on two commits, to compare them;
``EMBARK_KERNEL_BACKEND`` picks the kernels' backend.

Engine CPU ms is the rank's main-thread CPU time (``time.thread_time``) across the
step minus the main thread's CPU time inside the collectives (gloo moves the bytes
on its own threads, and a rank waiting for its peers sleeps), median over the timed
steps, averaged over the ranks. Unlike wall time it hardly moves when other
processes share the cores, so it is the column to compare between commits; the
collective column is the wall time spent inside the collectives (the wait).

    python benchmarks/engine_step.py [--world 2] [--batch 512] [--steps 40] \\
        [--clusters rb,ub] [--compressions fp32,fp16,fp8,int8] [--hierarchical]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine import OptimizerKind, SparseOptimizer
from lightning_embark.lists import list_items
from lightning_embark.plan import Compression
from lightning_embark.testing import all_layouts_plan, random_batches, run_gloo_ranks
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

RANKS_PER_HOST = 2
WARMUP = 5
#: The collectives an engine step calls, all through the ``torch.distributed`` module.
COLLECTIVES = ("all_to_all_single", "all_reduce", "broadcast", "all_gather_into_tensor")


class CollectiveClock:
    """Main-thread CPU and wall seconds spent inside ``torch.distributed`` collectives.

    Installed by wrapping the module's functions, which every exchange calls through
    the module attribute (as :func:`lightning_embark.accounting.counting_collectives`
    relies on too).
    """

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0
        for name in COLLECTIVES:
            setattr(dist, name, self._timed(getattr(dist, name)))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu += time.thread_time() - cpu
                self.wall += time.perf_counter() - wall

        return timed


def time_steps(
    rank: int,
    world: int,
    cluster: str,
    compression: str,
    hierarchical: bool,
    batch: int,
    steps: int,
) -> None:
    """Time ``steps`` fwd+bwd steps (after warm-up); rank 0 prints the table row."""
    torch.set_num_threads(1)
    clock = CollectiveClock()
    scenario = all_layouts_plan(
        world,
        min(world, RANKS_PER_HOST),
        cluster,
        forward=compression,
        backward=compression,
        hierarchical=hierarchical,
    )
    torch.manual_seed(0)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        EmbeddingBagCollection(tables=scenario.tables),
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=0.01),
    )
    batches = [random_batches(scenario, [batch] * world, seed=seed)[rank] for seed in range(4)]
    times, cpu_times, waits = [], [], []
    for step in range(WARMUP + steps):
        dist.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        inside_cpu, inside_wall = clock.cpu, clock.wall
        sharded(batches[step % len(batches)]).values().sum().backward()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu - (clock.cpu - inside_cpu))
        waits.append(clock.wall - inside_wall)
    # Every rank's medians (the ranks' work differs: owners of more blocks do more).
    mine = [statistics.median(x[WARMUP:]) for x in (cpu_times, waits)]
    medians: list[list[float] | None] = [None] * world
    dist.all_gather_object(medians, mine)
    timed = times[WARMUP:]
    if rank == 0:
        deciles = (
            statistics.quantiles(timed, n=10, method="inclusive") if len(timed) > 1 else timed * 9
        )
        p10, p90 = deciles[0], deciles[-1]
        engine_cpu, wait = (statistics.fmean(m[i] for m in medians if m) for i in (0, 1))
        exchange = "hierarchical" if hierarchical else "flat"
        print(
            f"| {cluster} | {compression} | {exchange} | {statistics.median(timed) * 1e3:.1f} "
            f"| {p10 * 1e3:.1f}-{p90 * 1e3:.1f} | {engine_cpu * 1e3:.2f} | {wait * 1e3:.2f} |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="gloo ranks (hosts of 2 ranks)")
    parser.add_argument("--batch", type=int, default=512, help="samples per rank")
    parser.add_argument("--steps", type=int, default=40, help="timed steps, after 5 warm-up steps")
    parser.add_argument("--clusters", default="rb,ub")
    parser.add_argument("--compressions", default="fp32,fp16,fp8,int8")
    parser.add_argument(
        "--hierarchical", action="store_true", help="hierarchical exchange (needs --world >= 4)"
    )
    args = parser.parse_args(argv)
    clusters = list_items(args.clusters)
    compressions = list_items(args.compressions)
    if args.world < 1 or args.batch < 1 or args.steps < 1:
        parser.error("--world, --batch and --steps must be positive")
    if args.world > RANKS_PER_HOST and args.world % RANKS_PER_HOST:
        parser.error(
            f"--world {args.world}: use a multiple of {RANKS_PER_HOST} (hosts of {RANKS_PER_HOST} "
            "ranks)"
        )
    if bad := [c for c in clusters if c not in ("rb", "ub")]:
        parser.error(f"--clusters {bad}: use rb and/or ub")
    known = [c.value for c in Compression]
    if bad := [c for c in compressions if c not in known]:
        parser.error(f"--compressions {bad}: use some of {known}")
    print(
        f"{args.world} rank(s), {args.batch} samples per rank, median of {args.steps} steps (fwd "
        "+ bwd)\n"
    )
    print(
        "| cluster | compression | exchange | median ms | p10-p90 ms | engine CPU ms "
        "| collective ms |"
    )
    print("|---|---|---|---:|---|---:|---:|")
    for cluster in clusters:
        for compression in compressions:
            run_gloo_ranks(
                time_steps,
                args.world,
                cluster,
                compression,
                args.hierarchical,
                args.batch,
                args.steps,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
