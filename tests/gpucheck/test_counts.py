"""What a GPU would see of one step of the GPU check's engine, pinned: the calls that would
make the host wait for a CUDA device, per cluster and direction, and the collectives. A
change that adds a sync to the step (or a collective) fails here; one that removes some
updates these numbers and says why.

The plan and model are the check's (:mod:`lightning_embark.gpucheck._scenario`) on 2 gloo
ranks, one per host: DP table ``dp``; RB cluster ``rb`` (``tw`` table-wise on rank 1,
``rw`` row-wise over both ranks, ``cw`` column-wise over both); RB cluster ``rb16``
(``h16`` row-wise, fp16 / bf16, a hierarchical exchange); UB cluster ``ub`` (``ub``
row-wise); UB cluster ``ub8`` (``u8`` table-wise on rank 1, int8 / bf16). The engine runs as
``strategy="embark"`` does by default (lane and input pipeline), with the torch store (the
check's, which needs no fbgemm), and the step is the second one
(:func:`~lightning_embark.gpucheck._counts.counted_step`). Every count below is per step
and rank.

Why each sync is there (the call sites the counter names), one per cluster and
direction at most, the same on both ranks:

* outside the clusters, 1 (on the input pipeline's thread): the ID range check's verdict
  (``engine/_checks.py``), which decides the status every header carries.
* ``<c>:ahead`` - the input distribution the input pipeline runs: 1 per cluster, the
  header's one host copy (``clusters/_remote.py``, ``distribute``). The requester counts
  its requests on the device (RB: the row-split pieces by ``bin_counts``; UB: the
  unique IDs' run lengths, :func:`~lightning_embark.engine.clusters._unique.unique_runs`),
  makes its headers from those counts on the device, and copies its own counts and the
  headers it received to the host together, after the header exchange: they size every
  message after it. Host lists reach the device through ``to_device`` (pinned, queued),
  and a one-rank host group (``rb16``'s hierarchy on 2 hosts of 1) swaps no counts.
* ``<c>:forward`` - none: the owners' bags carry their per-block ID counts, the layouts
  come from the header's counts.
* ``<c>:backward`` - none in the remote clusters: the torch store's update sums each
  block's gradients per row at a static size (``padded_row_grads``, no ``unique``), a UB
  requester's per-row gradients are host work on the CPU and a gather on a GPU. ``dp``
  takes 1, the ``nonzero`` of the rows its all-reduce touched (``clusters/_dp.py``).

Collectives per step and rank: 24 ``all_to_all_single`` and 1 ``all_reduce`` (the DP
gradients). A flat cluster sends 2 messages ahead (header, IDs) and one each way in the
step (rows, gradients); ``rb16``'s hierarchical exchange takes 3 collectives per message
(the intra-host stage, and the cross-host stage in each direction on its own group).
"""

from __future__ import annotations

import pytest
import torch

from lightning_embark.accounting import OUTSIDE, DispatchSnapshot
from lightning_embark.engine import EmbeddingEngine, EngineConfig, OptimizerKind, SparseOptimizer
from lightning_embark.gpucheck._counts import counted_step
from lightning_embark.gpucheck._scenario import LEARNING_RATE, Scenario
from lightning_embark.testing import run_gloo_ranks

SYNCS = {
    OUTSIDE: 1,
    "dp:backward": 1,
    "rb:ahead": 1,
    "rb16:ahead": 1,
    "ub:ahead": 1,
    "ub8:ahead": 1,
}
COLLECTIVES = {
    "dp:backward": 1,
    "rb:ahead": 2,
    "rb:forward": 1,
    "rb:backward": 1,
    "rb16:ahead": 6,
    "rb16:forward": 3,
    "rb16:backward": 3,
    "ub:ahead": 2,
    "ub:forward": 1,
    "ub:backward": 1,
    "ub8:ahead": 2,
    "ub8:forward": 1,
    "ub8:backward": 1,
}


def _engine(scenario: Scenario, *, pipeline: bool, overlap: bool) -> EmbeddingEngine:
    return EmbeddingEngine(
        scenario.tables,
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=LEARNING_RATE),
        config=EngineConfig(store="torch", pipeline=pipeline, overlap=overlap),
        weights=scenario.weights,
    )


def _count(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    row = counted_step(
        rank,
        world,
        batch=32,
        seed=5,
        device=torch.device("cpu"),
        engine=_engine,
    )
    counts = DispatchSnapshot.from_dict(row["counts"])
    assert counts.syncs_by_scope() == SYNCS, counts.syncs_by_scope()
    assert counts.device_syncs == sum(SYNCS.values())
    assert counts.collectives_by_scope() == COLLECTIVES
    # The byte counter saw the same collectives, as torch.distributed calls.
    assert row["collectives"] == {"all_to_all_single": 24, "all_reduce": 1}
    assert sum(COLLECTIVES.values()) == 25
    assert row["measured_syncs"] is None  # measured on CUDA only
    threads = counts.ops_by("thread")
    assert set(threads) == {"MainThread", "embark-lane", "embark-input"}


@pytest.mark.multiprocess
def test_the_steps_host_syncs_and_collectives_are_pinned() -> None:
    run_gloo_ranks(_count, 2)
