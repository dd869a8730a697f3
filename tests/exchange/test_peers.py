"""A peer that dies mid-training: its survivors get a PeerError naming rank, cluster and phase."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._sharded import ShardedEmbeddingBagCollection
from lightning_embark.errors import ConfigError, PeerError
from lightning_embark.exchange._peers import is_peer_failure, peer_failures
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, random_batches

GLOO_CLOSED = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:25289. This is typically caused by a remote worker crashing."
)


def test_only_transport_failures_count_as_peer_failures() -> None:
    assert is_peer_failure(RuntimeError(GLOO_CLOSED))
    assert is_peer_failure(
        RuntimeError("[gloo] Timed out waiting 1800000ms for recv operation to complete")
    )
    assert is_peer_failure(dist.DistBackendError("NCCL error: remote process exited"))
    assert not is_peer_failure(
        RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")
    )
    assert not is_peer_failure(ConfigError("timed out is in this message, but it is ours"))
    assert not is_peer_failure(ValueError("Connection closed by peer"))


def test_peer_failures_names_rank_cluster_phase_and_keeps_the_cause() -> None:
    with (
        pytest.raises(
            PeerError, match=r"rank 3: the backward exchange of embedding cluster 'ub' failed"
        ) as info,
        peer_failures(3, "ub", "backward"),
    ):
        raise RuntimeError(GLOO_CLOSED)
    assert "Connection closed by peer" in str(
        info.value
    ) and "raise the process group's timeout" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    # Our own bugs pass through untouched.
    with pytest.raises(RuntimeError, match="size of tensor"), peer_failures(0, "rb", "forward"):
        raise RuntimeError("The size of tensor a (3) must match the size of tensor b (4)")


def _survivor_sees_a_peer_error(rank: int, world: int) -> None:
    scenario = all_layouts_plan(world, 1, "rb")
    torch.manual_seed(0)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        EmbeddingBagCollection(tables=scenario.tables),
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=0.1),
    )
    batch = random_batches(scenario, [4] * world, seed=0)[rank]
    sharded(batch).values().sum().backward()  # one good step together
    if rank == 1:
        os._exit(0)  # the peer dies between steps
    with pytest.raises(
        PeerError,
        match=r"rank 0: the forward exchange of embedding cluster 'main' failed because another "
        r"rank is gone",
    ):
        sharded(batch)
    os._exit(0)  # skip the harness's closing barrier: the peer is gone


@pytest.mark.multiprocess
def test_a_dead_peer_gives_a_peer_error() -> None:
    run_gloo_ranks(_survivor_sees_a_peer_error, 2)
