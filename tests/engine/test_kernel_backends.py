"""The engine's exchanges through the Triton kernels give the reference ops' bits.

The engine encodes, decodes and reduces through :mod:`lightning_embark.kernels`, which
picks Triton on CUDA and the reference ops on the CPU. Forcing ``triton`` here runs
the kernels in Triton's interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET=1``)
inside a real sharded module on gloo ranks: forward outputs and the updated weights
must equal the reference backend's exactly, for flat and hierarchical, RB and UB,
compressed both ways. With the reference backend checked against the unsharded model
(``test_sharded_exactness.py``), this checks the kernels as the engine calls them.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.kernels import BACKEND_ENV
from lightning_embark.kernels._ops import interpreted
from lightning_embark.plan._types import Compression
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, random_batches
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

RANKS_PER_HOST = 2
BATCH = 5
STEPS = 2

# (cluster, hierarchical, forward, backward)
CASES = [
    ("rb", False, Compression.BF16, Compression.FP8),
    ("rb", True, Compression.FP8, Compression.INT8),
    ("ub", False, Compression.INT8, Compression.FP16),
    ("ub", True, Compression.FP8, Compression.FP8),
]


def _train(rank: int, world: int, case: tuple, backend: str) -> list[torch.Tensor]:
    """Forward outputs of every step and the local blocks' weights at the end."""
    cluster, hierarchical, forward, backward = case
    os.environ[BACKEND_ENV] = backend
    scenario = all_layouts_plan(
        world,
        RANKS_PER_HOST,
        cluster,
        forward=forward,
        backward=backward,
        hierarchical=hierarchical,
    )
    torch.manual_seed(99)
    ebc = EmbeddingBagCollection(tables=scenario.tables)
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.05, eps=1e-6)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, scenario.plan, sparse_optimizer=optimizer
    )
    width = sum(t.embedding_dim * len(t.feature_names) for t in scenario.tables)
    seen = []
    for step in range(STEPS):
        local = random_batches(scenario, [BATCH] * world, seed=7 * step + world)
        out = sharded(local[rank])
        upstream = torch.randn(BATCH, width, generator=torch.Generator().manual_seed(step + rank))
        (out.values() * upstream).sum().backward()
        seen.append(out.values().detach().clone())
    return seen + [shard.weight.clone() for shard in sharded.local_shards()]


def check_backends(rank: int, world: int) -> None:
    from lightning_embark.kernels import _ops as ops

    calls: Counter[str] = Counter()
    for name in ("pack_triton", "unpack_reduce_triton"):
        launcher = getattr(ops, name)

        def counted(*args, _launcher=launcher, _name=name, **kwargs):
            calls[_name] += 1
            return _launcher(*args, **kwargs)

        setattr(ops, name, counted)
    for case in CASES:
        expected = _train(rank, world, case, "reference")
        assert not calls, "the reference run must not launch kernels"
        actual = _train(rank, world, case, "triton")
        assert calls["pack_triton"] and calls["unpack_reduce_triton"], (
            f"{case}: no kernel ran: {calls}"
        )
        calls.clear()
        assert len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert torch.equal(a, e), (
                f"rank {rank} {case}: tensor {i} differs (max {float((a - e).abs().max())})"
            )


@pytest.mark.multiprocess
def test_triton_backend_matches_reference_in_the_engine() -> None:
    if not interpreted():
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 (tests/conftest.py sets it first)"
        )
    run_gloo_ranks(check_backends, 4)
