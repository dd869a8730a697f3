"""What each rank of the check runs: the kernels' self-check (one rank), one exact step,
one counted step (:mod:`._counts`), then the timed steps.

Ranks are spawned processes (CUDA cannot be used after a fork), one per device: rank
``r`` runs on ``cuda:r`` over NCCL, or on the CPU over gloo. A fresh process imports triton
after the launcher set its environment, which is how the CPU ranks get Triton's
interpreter. Each writes its results to ``<out>/rank<r>.pt``, which the launcher
(:mod:`._check`) reads.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine import EmbeddingEngine, EngineConfig, OptimizerKind, SparseOptimizer
from lightning_embark.gpucheck._counts import counted_step, on_device
from lightning_embark.gpucheck._scenario import LEARNING_RATE, TIMED, Scenario, build
from lightning_embark.kernels import BACKEND_ENV

#: Kernel backends the timings compare: the fused Triton kernels and the torch ops.
BACKENDS = ("triton", "reference")


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """What every rank of one run does.

    Attributes:
        device: ``cuda`` or ``cpu``.
        rendezvous: A file for the process group's rendezvous.
        out: The folder each rank writes ``rank<r>.pt`` to.
        batch: Samples per rank of the exact step.
        timing_batch: Samples per rank of the timed steps.
        steps: Timed steps per cluster type and backend (after ``warmup``).
        warmup: Untimed steps first.
        store: The engine's store (``torch`` or ``fbgemm``).
        seed: The scenario's seed.
        kernel_cases: Randomised cases of the kernels' self-check rank 0 runs first (0:
            none).
    """

    device: str
    rendezvous: str
    out: str
    batch: int
    timing_batch: int
    steps: int
    warmup: int
    store: str
    seed: int
    kernel_cases: int = 0


def run_rank(rank: int, world: int, job: RankJob) -> None:
    """One rank (``torch.multiprocessing`` entry point): init, exact step, timings."""
    cuda = job.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    result: dict[str, Any] = {"rank": rank, "device": str(device)}
    if rank == 0 and job.kernel_cases:
        result["kernels"] = _self_check(job, device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"file://{job.rendezvous}",
        rank=rank,
        world_size=world,
        # NCCL binds the group to this rank's GPU (its barriers use it, not device 0).
        device_id=device if cuda else None,
    )
    try:
        result["exact"] = _exact_step(rank, world, job, device)
        result["counted"] = counted_step(
            rank,
            world,
            batch=job.batch,
            seed=job.seed + 2,
            device=device,
            engine=functools.partial(_engine, job=job, device=device),
        )
        result["timings"] = _timings(rank, world, job, device)
        torch.save(result, Path(job.out) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _self_check(job: RankJob, device: torch.device) -> dict[str, Any]:
    """The kernels' self-check on this rank's device, and how its kernels ran."""
    from lightning_embark.kernels import interpreted
    from lightning_embark.kernels.selfcheck import run_checks

    cases = run_checks(
        device, num_cases=job.kernel_cases, seed=job.seed, wide=device.type == "cuda"
    )
    return {"cases": [vars(c) for c in cases], "interpreted": interpreted()}


def _engine(
    scenario: Scenario,
    job: RankJob,
    device: torch.device,
    *,
    overlap: bool = False,
    pipeline: bool = False,
) -> EmbeddingEngine:
    return EmbeddingEngine(
        scenario.tables,
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=LEARNING_RATE),
        config=EngineConfig(store=job.store, overlap=overlap, pipeline=pipeline),
        weights=scenario.weights,
        device=device,
    )


def _exact_step(rank: int, world: int, job: RankJob, device: torch.device) -> dict[str, Any]:
    """Forward, backward of ``sum(out * g)`` and the SGD update: the outputs and every
    block this rank holds afterwards (on the CPU); and whether an engine that overlaps its
    clusters' exchanges (``overlap=True``: a worker thread, on CUDA a side stream) gave the
    same bits for the same step."""
    scenario = build(world, batch=job.batch, seed=job.seed)
    results: list[dict[str, Any]] = []
    for overlap in (False, True):
        engine = _engine(scenario, job, device, overlap=overlap)
        out = engine.lookup(on_device(scenario.batches[rank], device))
        (out * scenario.grads[rank].to(device)).sum().backward()
        results.append(
            {
                "keys": engine.output_keys,
                "out": out.detach().cpu(),
                "shards": [
                    (s.table, s.rows.cpu(), s.col_start, s.col_end, s.weight.detach().cpu())
                    for s in engine.local_shards()
                ],
            }
        )
        engine.close()
    plain, overlapped = results
    plain["overlap_identical"] = torch.equal(plain["out"], overlapped["out"]) and all(
        torch.equal(a[4], b[4]) for a, b in zip(plain["shards"], overlapped["shards"], strict=True)
    )
    return plain


def _timings(rank: int, world: int, job: RankJob, device: torch.device) -> list[dict[str, Any]]:
    """Median forward + backward seconds per cluster type and kernel backend, the
    slowest rank's (each step ends at a barrier, so ranks wait for each other anyway)."""
    rows = []
    saved = os.environ.get(BACKEND_ENV)
    try:
        for cluster, tables in TIMED.items():
            scenario = build(world, batch=job.timing_batch, seed=job.seed + 1, only=tables)
            engine = _engine(scenario, job, device)
            batch = on_device(scenario.batches[rank], device)
            grad = scenario.grads[rank].to(device)
            for backend in BACKENDS:
                os.environ[BACKEND_ENV] = backend
                seconds = []
                for step in range(job.warmup + job.steps):
                    dist.barrier()
                    _sync(device)
                    start = time.perf_counter()
                    (engine.lookup(batch) * grad).sum().backward()
                    _sync(device)
                    if step >= job.warmup:
                        seconds.append(time.perf_counter() - start)
                slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                rows.append(
                    {
                        "cluster": cluster,
                        "backend": backend,
                        "median_ms": 1e3 * statistics.median(slowest.cpu().tolist()),
                        "steps": job.steps,
                    }
                )
    finally:
        if saved is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = saved
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
