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

Why each sync is there (the call sites the counter names; "host list" is a
``torch.tensor`` of Python data made on the device: on CUDA a blocking copy, which waits for
the stream):

* outside the clusters, 2 (on the input pipeline's thread): the ID range check's verdict
  (``engine/_checks.py``) and the batch's per-feature ID counts as a host list
  (``engine/_jagged.py``, ``feature_of``).
* ``<c>:ahead`` - the input distribution the input pipeline runs. Every cluster: its header,
  2 (a host list of counts, ``tolist`` of the counts received: ``clusters/_remote.py``), and
  its features' ID counts, 1 (``_jagged.py``). Gathering the ID messages segment by segment
  takes 2 host lists per gather (``_jagged.py``, ``segment_index``): 3 gathers for ``rb``,
  ``rb16`` and ``ub``, none for ``ub8`` on rank 0 and 2 on rank 1, its owner. An RB row-split
  feature (``rw``, ``h16``) adds 4 (``bincount`` of IDs and of bag lengths per shard, the
  kept pieces as a host list, the counts' ``tolist``: ``clusters/_rb.py``); a UB cluster its
  ``unique`` and the ``bincount`` and ``tolist`` of unique IDs per table (3,
  ``clusters/_ub.py``), and a row-split UB table (``ub``) 3 more for its boolean-mask split
  (one ``index``, two ``index_put_``). An owner of UB rows makes its bag counts a host list,
  1 (``clusters/_owner_requests.py``: ``ub``, and ``ub8`` on rank 1). ``rb16``'s
  hierarchical exchange swaps its intra-host counts for each of its 2 messages (a host list
  and a ``tolist``: ``exchange/_alltoall.py``), 4. So ``rb`` 13, ``rb16`` 17, ``ub`` 16,
  ``ub8`` 6 (rank 1: 11).
* ``<c>:forward`` - the owners' lookups and the rows exchange: the torch store reads each
  block's bag bounds on the host (``stores/_base.py``, ``block``), one per block it looks up
  (``dp`` 1, ``rb`` 2 or 3, ``rb16`` 1, ``ub`` 1, ``ub8`` 0 or 1); a UB owner's answer layout
  takes 2 host lists (``clusters/_ub.py``: ``ub``, ``ub8`` on rank 1); mean pooling's mask
  is a host list (``clusters/_base.py``: ``ub8``); ``rb16``'s count swap, 2.
* ``<c>:backward`` - the torch store's update of each block it holds (``repeat_interleave``
  and ``unique``: ``stores/_base.py``), 2 per block (``rb`` 2 blocks on rank 0, 3 on rank
  1; ``rb16`` and ``ub`` one; ``ub8`` none on rank 0, one on rank 1), and a UB owner's bag
  bounds read once more (``block``, 1). A UB requester's gradient per unique row coalesces
  its sparse product, 1 (``clusters/_ub.py``); ``rb16`` swaps counts again, 2; ``dp`` takes
  2 (``repeat_interleave`` of its IDs' bags, ``nonzero`` of the rows the all-reduce
  touched: ``clusters/_dp.py``).

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
        OUTSIDE: 2,
        "dp:forward": 1,
        "dp:backward": 2,
        "rb:ahead": 13,
        "rb:forward": 2,
        "rb:backward": 4,
        "rb16:ahead": 17,
        "rb16:forward": 3,
        "rb16:backward": 4,
        "ub:ahead": 16,
        "ub:forward": 3,
        "ub:backward": 4,
        "ub8:ahead": 6,
        "ub8:forward": 1,
        "ub8:backward": 1,
    },
    1: {
        OUTSIDE: 2,
        "dp:forward": 1,
        "dp:backward": 2,
        "rb:ahead": 13,
        "rb:forward": 3,
        "rb:backward": 6,
        "rb16:ahead": 17,
        "rb16:forward": 3,
        "rb16:backward": 4,
        "ub:ahead": 16,
        "ub:forward": 3,
        "ub:backward": 4,
        "ub8:ahead": 11,
        "ub8:forward": 4,
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
