"""A peer that dies mid-training: its survivors get a PeerError naming rank, cluster and phase."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError, PeerError
from lightning_embark.exchange._peers import dense_peer_failures, is_peer_failure, peer_failures
from lightning_embark.models import DLRMModule
from lightning_embark.registry import register_strategies
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, random_batches
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

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
        # Each phase in its step: an overlapped engine's backward runs on past the step, and
        # the peer's death may then be met there (named so; tested on the emulated cluster).
        config=EngineConfig(overlap=False),
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


#: What DDP raises on the survivor when the dense-gradient all-reduce of a Python
#: communication hook fails (its reducer casts the hook's exception to a tensor).
DDP_HOOK_FAILED = f"Unable to cast {GLOO_CLOSED} to Tensor"


def test_a_failed_dense_hook_names_rank_and_phase_and_quotes_the_transport() -> None:
    with (
        pytest.raises(
            PeerError, match=r"rank 1: the backward exchange of the dense part \(DDP's"
        ) as info,
        dense_peer_failures(1, "backward"),
    ):
        raise RuntimeError(DDP_HOOK_FAILED)
    message = str(info.value)
    assert "(" + GLOO_CLOSED + ")" in message and "Unable to cast" not in message
    assert isinstance(info.value.__cause__, RuntimeError)
    # A PeerError of the engine inside passes through, naming its cluster.
    with (
        pytest.raises(PeerError, match="embedding cluster 'rb'"),
        dense_peer_failures(0, "backward"),
        peer_failures(0, "rb", "backward"),
    ):
        raise RuntimeError(GLOO_CLOSED)


class _DieBeforeSecondStep(Callback):
    """Rank 1 exits before its second training step, with no error of its own."""

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 1 and trainer.global_rank == 1:
            os._exit(0)


def _lightning_survivor_sees_a_peer_error(rank: int, world: int, synthetic: Any) -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=40, dim=4)
    torch.manual_seed(0)
    model = DLRMModule(spec, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
    batches = synthetic.synthetic_batches(spec, num_batches=3, batch_size=4, seed=rank)
    trainer = quiet_trainer(
        strategy=EmbarkStrategy(timeout=datetime.timedelta(seconds=30)),
        devices=world,
        max_steps=3,
        use_distributed_sampler=False,
        callbacks=[_DieBeforeSecondStep()],
    )
    # The second step's first collective is DDP's buffer broadcast before the forward,
    # outside the engine: before, the survivor got gloo's bare RuntimeError there. The
    # strategy's liveness sockets name the rank that is gone.
    with pytest.raises(
        PeerError,
        match=r"rank 0: the training forward exchange of the dense part .* failed because "
        r"rank 1 on host 0 \(.*127\.0\.0\.1\) is gone: its process ended without an error",
    ) as info:
        trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    assert info.value.gone == (1,)
    os._exit(0)  # skip the harness's closing barrier: the peer is gone


@pytest.mark.multiprocess
def test_a_dead_peer_on_one_host_gives_a_peer_error_under_lightning(synthetic: Any) -> None:
    """2 local ranks under ``strategy="embark"``; rank 1 dies between steps."""
    run_gloo_ranks(_lightning_survivor_sees_a_peer_error, 2, synthetic)
