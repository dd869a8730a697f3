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
and rank; where the two ranks differ, it is because rank 1 holds more blocks.

Why each sync is there (the call sites the counter names):

* outside the clusters, 1: the ID range check brings every feature's min and max to the
  host in one copy (``engine/_checks.py``, on the input pipeline's thread).
* ``<c>:ahead`` - the input distribution, run by the input pipeline: 2 per cluster for the
  header (``torch.tensor`` of the counts to the device, ``tolist`` of the counts received:
  ``clusters/_remote.py``); an RB row-split feature adds 4 (``rw``, ``h16``: ``bincount``
  and its ``tolist`` of IDs per row shard, ``bincount`` of bag lengths per shard:
  ``clusters/_rb.py``; the sample of every ID, ``repeat_interleave``: ``_batch.py``); a UB
  table adds ``unique`` (``clusters/_ub.py``) and, when row-split (``ub``), a ``bincount`` and
  its ``tolist`` of unique IDs per shard. ``rb16``'s hierarchical exchange swaps its
  intra-host counts for each of its 2 messages (``torch.tensor`` and ``tolist``:
  ``exchange/_alltoall.py``), 4 more: ``rb`` 6, ``rb16`` 10, ``ub`` 5, ``ub8`` 3.
* ``<c>:forward`` - the rows exchange, sizes known from the header: none, but ``rb16``'s
  count swap, 2.
* ``<c>:backward`` - the torch store's update of each block it holds (``repeat_interleave``
  and ``unique``: ``stores/_base.py``), 2 per block: ``rb`` 2 blocks on rank 0 (``rw``,
  ``cw`` shards), 3 on rank 1 (and ``tw``); ``rb16``, ``ub`` one each; ``ub8`` none on rank
  0, one on rank 1. A UB feature's gradient per unique row adds 2 (``repeat_interleave``
  of its samples, the sparse product's coalesce: ``clusters/_ub.py``), ``rb16`` its count
  swap (2), ``dp`` 2 (``repeat_interleave`` per table, then ``nonzero`` of the rows the
  all-reduce touched: ``clusters/_dp.py``).

Collectives per step and rank: 28 ``all_to_all_single`` and 1 ``all_reduce`` (the DP
gradients). A flat cluster sends 2 messages ahead (header, IDs) and one each way in the
step (rows, gradients); ``rb16``'s hierarchical exchange takes 4 collectives per message
(the count swap, the intra-host stage, and the cross-host stage in each direction on its
own group).
"""

from __future__ import annotations

import pytest
import torch

from lightning_embark.accounting import OUTSIDE, DispatchSnapshot
from lightning_embark.engine import EmbeddingEngine, OptimizerKind, SparseOptimizer
from lightning_embark.gpucheck._counts import counted_step
from lightning_embark.gpucheck._scenario import LEARNING_RATE, Scenario
from lightning_embark.testing import run_gloo_ranks

SYNCS_BY_RANK = {
    0: {
        OUTSIDE: 1,
        "dp:backward": 2,
        "rb:ahead": 6,
        "rb:backward": 4,
        "rb16:ahead": 10,
        "rb16:forward": 2,
        "rb16:backward": 4,
        "ub:ahead": 5,
        "ub:backward": 4,
        "ub8:ahead": 3,
        "ub8:backward": 2,
    },
    1: {
        OUTSIDE: 1,
        "dp:backward": 2,
        "rb:ahead": 6,
        "rb:backward": 6,
        "rb16:ahead": 10,
        "rb16:forward": 2,
        "rb16:backward": 4,
        "ub:ahead": 5,
        "ub:backward": 4,
        "ub8:ahead": 3,
        "ub8:backward": 4,
    },
}
COLLECTIVES = {
    "dp:backward": 1,
    "rb:ahead": 2,
    "rb:forward": 1,
    "rb:backward": 1,
    "rb16:ahead": 8,
    "rb16:forward": 4,
    "rb16:backward": 4,
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
        kernel="torch",
        weights=scenario.weights,
        pipeline=pipeline,
        overlap=overlap,
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
    assert counts.syncs_by_scope() == SYNCS_BY_RANK[rank], counts.syncs_by_scope()
    assert counts.device_syncs == sum(SYNCS_BY_RANK[rank].values())
    assert counts.collectives_by_scope() == COLLECTIVES
    # The byte counter saw the same collectives, as torch.distributed calls.
    assert row["collectives"] == {"all_to_all_single": 28, "all_reduce": 1}
    assert sum(COLLECTIVES.values()) == 29
    assert row["measured_syncs"] is None  # measured on CUDA only
    threads = counts.ops_by("thread")
    assert set(threads) == {"MainThread", "embark-lane", "embark-input"}


@pytest.mark.multiprocess
def test_the_steps_host_syncs_and_collectives_are_pinned() -> None:
    run_gloo_ranks(_count, 2)
