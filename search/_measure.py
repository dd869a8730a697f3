"""One short measured run of a plan, on every rank, inside a process group that stays up.

A launch (interpreters, imports, rendezvous) costs more than a short trial, so the ranks
start once per study and take one plan after another: each run is a fresh
:class:`~lightning_embark.strategies.EmbarkStrategy` with the plan, a freshly seeded DLRM
and the same synthetic batches, trained by the Trainer ``embark-bench`` uses for
``warmup + steps`` steps (Lightning reuses the process group that is already up).

A step's time is the slowest rank's, as in ``embark-bench``: after each step every rank
contributes its step seconds to one ``MAX`` all-reduce (outside the timed region; the
counter of the next step is reset before it starts). The same all-reduce carries rank 0's
decision to stop (the pruner's verdict on the steps so far), so every rank stops at the
same step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist

from lightning_embark.errors import EmbarkError

#: ``crash:N``, ``hang:N`` or ``kill:N``: the last rank raises, sleeps forever, or is killed
#: (SIGKILL, as the out-of-memory killer does) in its second step, in trial ``N`` (for tests
#: of the study's fault handling; never set in real runs).
FAULT_ENV = "EMBARK_TUNE_FAULT"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What every run trains: the model, its batches and how many steps count."""

    model: str
    max_rows: int | None
    batch_size: int
    steps: int
    warmup: int
    seed: int
    interaction: str
    dense_arch: str
    over_arch: str
    dense_compression: str


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A run's slowest-rank step times (seconds), warm-up excluded, and whether it stopped
    early."""

    step_seconds: tuple[float, ...]
    stopped: bool

    @property
    def median(self) -> float:
        ordered = sorted(self.step_seconds)
        n = len(ordered)
        return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


class _StepSync(pl.Callback):
    """After each step: one MAX all-reduce of (step seconds, stop flag); see the module
    docstring. Placed after the accounting callback, which records the step first."""

    def __init__(
        self, accounting: Any, *, warmup: int, on_step: Callable[[int, float], bool] | None
    ) -> None:
        self.accounting, self.warmup, self.on_step = accounting, warmup, on_step
        self.maxima: list[float] = []
        self.stop = False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        seconds = self.accounting.steps[-1].seconds
        stop = 0.0
        index = len(self.maxima) - 1 - self.warmup  # the measured step finished last
        if self.on_step is not None and self.maxima and index >= 0:
            stop = float(self.on_step(index, self.maxima[-1]))
        values = torch.tensor([seconds, stop], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        self.maxima.append(float(values[0]))
        if values[1] > 0:
            self.stop = True
            trainer.should_stop = True


def _inject(trial: int | None, rank: int, world: int) -> list[pl.Callback]:
    """The fault :data:`FAULT_ENV` asks of this rank in this trial: raised or hung here, or
    the callback that kills the rank in the run."""
    fault = os.environ.get(FAULT_ENV, "")
    if not fault or trial is None or rank != world - 1:
        return []
    kind, _, number = fault.partition(":")
    if int(number) != trial:
        return []
    if kind == "crash":
        raise EmbarkError(f"injected crash in trial {trial} on rank {rank} ({FAULT_ENV})")
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "kill":
        return [_Killed()]
    return []


class _Killed(pl.Callback):
    """SIGKILLs this rank as its second step starts (the first one's updates in flight)."""

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def return_freed_memory() -> None:
    """Collect the finished run's cycles and hand glibc's free heap back to the system.

    A rank trains plan after plan in one process; each plan allocates tables and
    buffers of other sizes, and glibc keeps the freed chunks in its heaps. Measured on
    MLPerf DLRM-DCNv2 (100,000 rows) on 2 x 2 ranks, eight runs of four alternating
    plans grew the largest rank from 1.1 to 3.3 GiB without this, and held it at
    0.6 GiB with it; a 40-run study was killed by the out-of-memory killer. No-op where
    the C library has no ``malloc_trim``.
    """
    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def measure_plan(
    plan: dict[str, Any],
    workload: Workload,
    *,
    trial: int | None = None,
    on_step: Callable[[int, float], bool] | None = None,
) -> Measured:
    """Train ``plan`` for the workload's steps on every rank (collective: call it on all).

    Args:
        plan: The plan as a dict (what rank 0 broadcast).
        workload: Model, batches and step counts.
        trial: The trial's number (for fault injection), None outside trials.
        on_step: Rank 0's pruning hook: called with (measured step index, slowest-rank
            seconds) and returns whether to stop; None elsewhere.
    """
    from lightning_embark.accounting import CommAccountingCallback
    from lightning_embark.harness import bench_data, bench_model, bench_trainer
    from lightning_embark.plan import Plan, TowerModule, TowerRequest, save_towers
    from lightning_embark.spec import load_spec
    from lightning_embark.strategies import EmbarkStrategy

    rank, world = dist.get_rank(), dist.get_world_size()
    faults = _inject(trial, rank, world)
    parsed = Plan.from_dict(plan)
    spec = load_spec(workload.model, max_rows=workload.max_rows)
    # Compressing towers are part of the model: it trains over them (identity towers
    # leave it as it is).
    compressing = [
        TowerRequest.of(t) for t in parsed.towers if t.module is not TowerModule.IDENTITY
    ]
    with tempfile.TemporaryDirectory(prefix="embark-tune-towers-") as tmp:
        towers = None
        if compressing:
            towers = str(Path(tmp) / "towers.json")
            save_towers(compressing, towers)
        model = bench_model(
            spec,
            interaction=workload.interaction,
            dense_arch=workload.dense_arch,
            over_arch=workload.over_arch,
            seed=workload.seed,
            towers=towers,
        )
    total = workload.warmup + workload.steps
    data = bench_data(
        spec,
        batch_size=workload.batch_size,
        num_batches=total,
        seed=workload.seed,
        rank=rank,
        world_size=world,
    )
    accounting = CommAccountingCallback(ranks_per_host=parsed.ranks_per_host, log=False)
    sync = _StepSync(accounting, warmup=workload.warmup, on_step=on_step)
    # metrics=False: the trial's step times must not include the default metrics
    # callbacks' per-step work (a torch.unique per table); ``accounting`` counts the bytes.
    strategy = EmbarkStrategy(
        plan=parsed,
        sample_statistics=False,
        dense_compression=workload.dense_compression,
        metrics=False,
    )
    trainer = bench_trainer(
        strategy,
        num_hosts=parsed.num_hosts,
        ranks_per_host=parsed.ranks_per_host,
        max_steps=total,
        callbacks=[accounting, sync, *faults],
    )
    try:
        trainer.fit(model, data)
    finally:
        strategy.release()
        del trainer, strategy, model, data
        return_freed_memory()
    measured = tuple(sync.maxima[workload.warmup :])
    if not measured and not sync.stop:
        raise EmbarkError(
            f"the run recorded {len(sync.maxima)} steps but {workload.warmup} are warm-up; "
            "nothing was measured"
        )
    return Measured(step_seconds=measured, stopped=sync.stop)
