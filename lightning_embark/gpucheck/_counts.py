"""What a GPU sees of one step of the check's engine: ATen ops, host syncs, collectives.

Each rank counts its second training step (the first fills the caches a step builds once)
of the check's scenario with the engine as ``strategy="embark"`` runs it by default: its
clusters' exchanges on the lane and its input distributed by the input pipeline
(``pipeline=True, overlap=True``). The step is ``prefetch`` then ``lookup`` of its batch and
the backward, after a first step whose work is all done (settled), so that the step's
count (:class:`DispatchCounter`: everything the step queued to the engine's threads,
wherever it runs) and the collective calls counted meanwhile
(:class:`~lightning_embark.accounting.CommCounter`) are of the same work; the engine is
settled (the backward's updates run past the step, on the lane) before both are read.
Under Lightning the input pipeline runs each batch's distribution during the step before:
the same work per step, at another time.

On CUDA the step also runs under ``torch.cuda.set_sync_debug_mode("warn")``, which warns
at every call that makes the host wait for the device: those warnings are the syncs
measured, beside the counter's prediction (not yet run on a GPU).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_embark.accounting import (
    CommCounter,
    DispatchCounter,
    DispatchSnapshot,
    counting_collectives,
    format_dispatch,
    scope_clusters,
)
from lightning_embark.engine import EmbeddingEngine, FeatureBatch
from lightning_embark.gpucheck._scenario import build

#: The warning ``torch.cuda.set_sync_debug_mode("warn")`` gives at each synchronizing call.
SYNC_WARNING = "called a synchronizing CUDA operation"


def counted_step(
    rank: int,
    world: int,
    *,
    batch: int,
    seed: int,
    device: torch.device,
    engine: Callable[..., EmbeddingEngine],
) -> dict[str, Any]:
    """This rank's counts of the engine's second step (see the module docstring).

    Args:
        rank: This rank.
        world: Ranks.
        batch: Samples per rank.
        seed: The scenario's seed (two batches: ``seed`` and ``seed + 1``).
        device: The engine's device.
        engine: Builds the engine of a scenario (``engine(scenario, pipeline=, overlap=)``).
    """
    scenarios = [build(world, batch=batch, seed=seed + i) for i in range(2)]
    module = engine(scenarios[0], pipeline=True, overlap=True)
    scope_clusters(module)
    batches = [on_device(s.batches[rank], device) for s in scenarios]
    grads = [s.grads[rank].to(device) for s in scenarios]
    module.prefetch(batches[0])
    (module.lookup(batches[0]) * grads[0]).sum().backward()
    module.local_shards()  # the first step's work all done: none of it runs in the count
    counter, comm = DispatchCounter(), CommCounter(rank=rank, ranks_per_host=1)
    measured = None
    with counting_collectives(comm), _measuring_syncs(device) as caught:
        with counter.counting():
            module.prefetch(batches[1])
            (module.lookup(batches[1]) * grads[1]).sum().backward()
        module.local_shards()  # the backward's updates, still on the lane
        if caught is not None:
            measured = sum(SYNC_WARNING in str(w.message) for w in caught)
    module.close()
    return {
        "counts": counter.snapshot().to_dict(),
        "collectives": {n: s.calls for n, s in comm.snapshot().by_collective.items()},
        "measured_syncs": measured,
    }


@contextlib.contextmanager
def _measuring_syncs(device: torch.device) -> Iterator[list[warnings.WarningMessage] | None]:
    """On CUDA: sync debug mode at "warn" inside the block, its warnings caught (the list);
    elsewhere nothing (None)."""
    if device.type != "cuda":
        yield None
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")


def on_device(batch: dict[str, FeatureBatch], device: torch.device) -> dict[str, FeatureBatch]:
    return {
        name: FeatureBatch(values=b.values.to(device), lengths=b.lengths.to(device))
        for name, b in batch.items()
    }


def format_counts(rows: list[dict[str, Any]]) -> list[str]:
    """The report's counts: every rank's totals, then rank 0's of each world in full."""
    lines = [
        "",
        "| world | rank | ATen ops | would sync (counted) | syncs measured | collectives |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        counts = DispatchSnapshot.from_dict(row["counts"])
        measured = row["measured_syncs"]
        lines.append(
            f"| {row['world']} | {row['rank']} | {counts.total_ops} | {counts.device_syncs} | "
            f"{'-' if measured is None else measured} | {sum(row['collectives'].values())} |"
        )
    for row in rows:
        if row["rank"] == 0:
            lines += [
                "",
                format_dispatch(
                    f"world {row['world']}, rank 0, one step",
                    DispatchSnapshot.from_dict(row["counts"]),
                    collectives=row["collectives"],
                ),
            ]
    return lines
