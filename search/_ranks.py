"""The two roles of a study's ranks: rank 0 holds the study, every rank measures.

Launched like training (``torchrun`` or SLURM on every node, or ``embark-tune`` itself on
the emulated cluster, which runs this very code under torchrun per host; the entry point
is :func:`._session.run_ranks`). Rank 0 broadcasts each candidate plan
(``broadcast_object_list`` over the default group, :func:`lead_run`); every other rank
trains whatever it is sent (:func:`follow`) until rank 0 says stop.

Faults: a rank whose run raises writes ``fault-rank{R}.txt`` into the run folder and
exits non-zero (its peers cannot finish the collective anyway), so the launcher restarts
the ranks and the study goes on; the trial is marked failed with that reason (by the
launcher, or by the heartbeat on a real cluster). A trial that runs past the time limit
is failed by rank 0's watchdog, with the reason, before it exits for a restart.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import torch.distributed as dist

from lightning_embark.search._config import TuneConfig
from lightning_embark.search._measure import Measured, Workload, measure_plan

#: Exit status of a rank whose trial ran past the time limit.
TIMEOUT_EXIT = 124
FAULT_GLOB = "fault-rank*.txt"
RESULT_FILE = "result.json"


def workload(config: TuneConfig) -> Workload:
    return Workload(
        model=config.model,
        max_rows=config.max_rows,
        batch_size=config.batch_size,
        steps=config.steps,
        warmup=config.warmup,
        seed=config.seed,
        interaction=config.interaction,
        dense_arch=config.dense_arch,
        over_arch=config.over_arch,
        dense_compression=config.resolved_dense_compression,
    )


def broadcast(command: dict[str, Any] | None) -> dict[str, Any]:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def write_fault(run_dir: Path, rank: int, what: str, error: BaseException) -> None:
    """Leave this rank's reason where the launcher and rank 0 look for it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    last = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
    (run_dir / f"fault-rank{rank}.txt").write_text(
        f"rank {rank}, {what}: {type(error).__name__}: {error}{where}\n"
    )


#: How gloo words an error whose cause is on another rank (its connection went away).
_PEER_LOST = (
    "PeerError",
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker",
)


def fault_reasons(run_dir: Path, world_size: int | None = None) -> list[str]:
    """The ranks' written reasons; with ``world_size``, a hint when they only say a peer
    vanished: a rank killed by a signal (SIGKILL from the kernel's out-of-memory killer
    is the usual one) cannot write its own reason, so the silent ranks are named."""
    files = sorted(run_dir.glob(FAULT_GLOB))
    reasons = [p.read_text().strip() for p in files]
    if world_size is None or not reasons:
        return reasons
    if all(any(lost in r for lost in _PEER_LOST) for r in reasons):
        wrote = {int(p.stem.removeprefix("fault-rank")) for p in files}
        silent = [r for r in range(world_size) if r not in wrote]
        reasons.append(
            f"ranks {silent} wrote no reason: killed by a signal (the kernel's out-of-memory "
            "killer sends SIGKILL; see `dmesg`) or stopped after a peer failed"
        )
    return reasons


class Watchdog:
    """Rank 0's deadline for one run: past it, ``on_expire`` records why, then the rank
    exits (its peers are stuck in a collective that will never finish)."""

    def __init__(self, seconds: float, on_expire: Callable[[], None]) -> None:
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._on_expire = on_expire

    def _fire(self) -> None:
        try:
            self._on_expire()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(TIMEOUT_EXIT)

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def follow(config: TuneConfig) -> int:
    """Ranks other than 0: run every plan rank 0 sends until it says stop."""
    rank, work = dist.get_rank(), workload(config)
    while True:
        command = broadcast(None)
        if command["op"] == "stop":
            return 0
        try:
            measure_plan(command["plan"], work, trial=command.get("trial"))
        except Exception as error:
            write_fault(config.run_dir, rank, command.get("what", "a run"), error)
            raise


def lead_run(
    config: TuneConfig,
    plan: dict[str, Any],
    *,
    trial: optuna.Trial | None,
    on_step: Callable[[int, float], bool] | None,
    what: str,
) -> Measured:
    """Rank 0: send ``plan`` to every rank and run it here too, under the watchdog."""
    number = trial.number if trial is not None else None

    def expire() -> None:
        reason = (
            f"{what} exceeded the trial time limit of {config.trial_timeout_s:g} s; its ranks "
            "were restarted"
        )
        print(f"[embark-tune] {reason}", file=sys.stderr, flush=True)
        config.run_dir.mkdir(parents=True, exist_ok=True)
        (config.run_dir / "fault-rank0.txt").write_text(f"rank 0: {reason}\n")
        if trial is not None:
            trial.set_user_attr("fail_reason", reason)
            trial.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)

    broadcast({"op": "measure", "plan": plan, "trial": number, "what": what})
    with Watchdog(config.trial_timeout_s, expire):
        try:
            return measure_plan(plan, workload(config), trial=number, on_step=on_step)
        except Exception as error:
            time.sleep(1.0)  # let a peer whose fault broke the collective write its reason
            write_fault(config.run_dir, 0, what, error)
            reasons = fault_reasons(config.run_dir, config.num_hosts * config.ranks_per_host)
            if trial is not None:
                trial.set_user_attr("fail_reason", "; ".join(reasons))
            raise
