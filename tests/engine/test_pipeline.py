"""The input pipeline: distributions run a step ahead give the same bits as run in the step.

The pipelined module runs the same arithmetic on the same IDs as the plain one (only the
process group and the thread that carry the IDs differ), so outputs and every block's
weights must be *equal*, not close, at every step. :class:`InputPipeline` itself is
checked in one process: order, identity keys, dropped results and errors.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._pipeline import InputPipeline
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression
from lightning_embark.testing import all_layouts_plan, random_batches, run_gloo_ranks
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

STEPS = 20
BATCH = 5


def _modules(
    world: int, cluster: str, *, hierarchical: bool, compression: Compression, weighted: bool
) -> tuple[object, ShardedEmbeddingBagCollection, ShardedEmbeddingBagCollection]:
    scenario = all_layouts_plan(
        world,
        min(world, 2),
        cluster,
        forward=compression,
        backward=compression,
        hierarchical=hierarchical,
        weighted=weighted,
    )
    torch.manual_seed(7)
    ebc = EmbeddingBagCollection(tables=scenario.tables, is_weighted=weighted)
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.05)
    plain = ShardedEmbeddingBagCollection.from_ebc(
        ebc,
        scenario.plan,
        sparse_optimizer=optimizer,
        config=EngineConfig(pipeline=False, overlap=False),
    )
    piped = ShardedEmbeddingBagCollection(
        ebc.embedding_bag_configs(),
        scenario.plan,
        sparse_optimizer=optimizer,
        is_weighted=weighted,
        weights={c.name: ebc.embedding_bags[c.name].weight.detach() for c in scenario.tables},
        config=EngineConfig(pipeline=True, overlap=False),
    )
    return scenario, plain, piped


def _same_steps(rank: int, world: int) -> None:
    """20 steps, each batch prefetched before the previous step's forward (as Lightning's
    fetcher holds one batch ahead), against the same steps without a pipeline."""
    for cluster, hierarchical, compression, weighted in (
        ("rb", True, Compression.FP16, False),
        ("ub", False, Compression.FP32, True),
    ):
        scenario, plain, piped = _modules(
            world,
            cluster,
            hierarchical=hierarchical,
            compression=compression,
            weighted=weighted,
        )
        assert piped.pipelined and not plain.pipelined
        sizes = [BATCH] * world
        batches = [
            random_batches(scenario, sizes, seed=step, weighted=weighted)[rank]
            for step in range(STEPS)
        ]
        piped.prefetch(batches[0])
        for step, batch in enumerate(batches):
            if step + 1 < STEPS:
                piped.prefetch(batches[step + 1])
            upstream = torch.randn(
                BATCH, sum(piped.output_dims), generator=torch.Generator().manual_seed(step)
            )
            expected = plain(batch).values()
            # ``.to()`` on its own device keeps the ID tensor: still the prefetched batch.
            actual = piped(batch.to(torch.device("cpu"))).values()
            assert torch.equal(actual, expected), f"{cluster} step {step}: outputs differ"
            (expected * upstream).sum().backward()
            (actual * upstream).sum().backward()
            for a, b in zip(plain.local_shards(), piped.local_shards(), strict=True):
                assert torch.equal(a.weight, b.weight), f"{cluster} step {step}: weights differ"
        assert piped.pipeline_counts == (STEPS, 0)
        # A validation-style lookup of another batch misses and still gives the same bits.
        other = random_batches(scenario, sizes, seed=99, weighted=weighted)[rank]
        with torch.no_grad():
            assert torch.equal(piped(other).values(), plain(other).values())
        assert piped.pipeline_counts == (STEPS, 1)


def _peer_error(rank: int, world: int) -> None:
    """A rank whose prefetched batch has an out-of-range ID: every rank raises at the
    lookup that takes it, naming the cause, and nobody hangs."""
    scenario, _, piped = _modules(
        world, "rb", hierarchical=False, compression=Compression.FP32, weighted=False
    )
    batch = random_batches(scenario, [BATCH] * world, seed=3)[rank]
    if rank == 1:
        values = batch.values().clone()
        values[0] = 10**6
        batch = KeyedJaggedTensor(
            keys=batch.keys(), values=values, lengths=batch.lengths(), stride=batch.stride()
        )
    piped.prefetch(batch)
    expected = "out of range" if rank == 1 else r"rank\(s\) \[1\] rejected"
    with pytest.raises(ConfigError, match=expected):
        piped(batch)


@pytest.mark.multiprocess
def test_pipelined_steps_are_bit_identical() -> None:
    run_gloo_ranks(_same_steps, 4)


@pytest.mark.multiprocess
def test_a_bad_prefetched_batch_raises_on_every_rank() -> None:
    run_gloo_ranks(_peer_error, 2)


def _prefetch_without_pipeline(rank: int, world: int) -> None:
    scenario, plain, _ = _modules(
        world, "ub", hierarchical=False, compression=Compression.FP32, weighted=False
    )
    with pytest.raises(ConfigError, match="pipeline=True"):
        plain.prefetch(random_batches(scenario, [2], seed=0)[0])


@pytest.mark.multiprocess
def test_prefetch_needs_a_pipeline() -> None:
    run_gloo_ranks(_prefetch_without_pipeline, 1)


# ------------------------------------------------------------------ InputPipeline alone
def test_results_are_taken_by_identity_and_older_ones_dropped() -> None:
    pipeline: InputPipeline[int] = InputPipeline(torch.device("cpu"))
    keys = [torch.zeros(1) for _ in range(3)]
    order: list[int] = []
    for i, key in enumerate(keys):
        pipeline.submit(key, lambda i=i: order.append(i) or 10 * i)
    assert pipeline.take(torch.zeros(1)) is None  # equal values, another tensor: a miss
    assert pipeline.take(keys[1]) == 10  # keys[0]'s result is dropped
    assert pipeline.pending == 1
    assert pipeline.take(keys[0]) is None
    assert pipeline.take(keys[2]) == 20
    assert order == [0, 1, 2]
    assert (pipeline.hits, pipeline.misses) == (2, 2)
    pipeline.close()


def test_work_runs_on_one_worker_thread_in_order_and_errors_reach_the_taker() -> None:
    pipeline: InputPipeline[str] = InputPipeline(torch.device("cpu"), depth=2)
    names: list[str] = []
    first, second, third = torch.zeros(1), torch.zeros(1), torch.zeros(1)

    def fail() -> str:
        raise ConfigError("peer rejected its batch")

    pipeline.submit(first, lambda: names.append(threading.current_thread().name) or "a")
    pipeline.submit(second, fail)
    pipeline.submit(third, lambda: "c")  # depth 2: ``first`` is dropped once it is done
    assert pipeline.pending == 2
    with pytest.raises(ConfigError, match="peer rejected"):
        pipeline.take(second)
    assert pipeline.take(third) == "c"
    assert names == ["embark-input"]
    pipeline.close()


def _miss_warning(rank: int, world: int) -> None:
    scenario, _, piped = _modules(
        world, "rb", hierarchical=False, compression=Compression.FP32, weighted=False
    )
    batch = random_batches(scenario, [BATCH] * world, seed=5)[rank]
    rebuilt = KeyedJaggedTensor(
        keys=batch.keys(),
        values=batch.values().clone(),
        lengths=batch.lengths(),
        stride=batch.stride(),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            piped.prefetch(batch)
            piped(rebuilt)
    messages = [str(w.message) for w in caught if "input pipeline" in str(w.message)]
    assert len(messages) == (1 if rank == 0 else 0), messages
    assert piped.pipeline_counts == (0, 2)


@pytest.mark.multiprocess
def test_miss_warning_is_rank_zeros_and_once() -> None:
    """A training lookup of tensors other than the prefetched ones warns once (rank 0)."""
    run_gloo_ranks(_miss_warning, 2)
