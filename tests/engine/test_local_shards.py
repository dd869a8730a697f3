"""The blocks a rank holds: seeded initialisation agrees across replicas and column
shards, and loading blocks is checked and round-trips."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

ADAGRAD = SparseOptimizer(kind=OptimizerKind.ADAGRAD, lr=0.1)


def _build(tables: list[EmbeddingBagConfig], plan, seed: int) -> ShardedEmbeddingBagCollection:
    return ShardedEmbeddingBagCollection(
        tables, plan, sparse_optimizer=ADAGRAD, config=EngineConfig(seed=seed)
    )


def _seeded_init(rank: int, world: int) -> None:
    scenario = all_layouts_plan(world, 2, "rb")
    tables = list(scenario.tables)
    sharded = _build(tables, scenario.plan, seed=7)
    mine = [
        (s.table, s.row_shard, s.rows.tolist(), s.col_start, s.col_end, s.weight.clone())
        for s in sharded.local_shards()
    ]
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    rows_of = {t.name: t.num_rows for t in sharded.table_infos}
    dim_of = {t.name: t.dim for t in sharded.table_infos}
    canvas = {name: torch.full((rows_of[name], dim_of[name]), float("nan")) for name in rows_of}
    for table, _, rows, start, end, weight in (b for blocks in gathered for b in blocks):
        bound = rows_of[table] ** -0.5
        assert weight.abs().max() <= bound  # torchrec's U(-1/sqrt(N), 1/sqrt(N))
        seen = canvas[table][rows, start:end]
        # Every replica of a block is drawn from the same seed: bit-identical.
        assert torch.equal(seen[~seen.isnan()], weight[~seen.isnan()]), table
        canvas[table][rows, start:end] = weight
    assert not any(c.isnan().any() for c in canvas.values())  # every element is held
    other = _build(tables, scenario.plan, seed=8).local_shards()
    assert not all(
        torch.equal(a[-1], b.weight) for a, b in zip(mine, other, strict=True)
    )  # the seed matters


@pytest.mark.multiprocess
def test_seeded_blocks_agree_across_replicas_and_cover_every_table() -> None:
    """Four ranks, so the scenario has replicas and column shards of one row shard."""
    run_gloo_ranks(_seeded_init, 4)


def _load_round_trip(rank: int, world: int) -> None:
    scenario = all_layouts_plan(world, 1, "ub")
    sharded = _build(list(scenario.tables), scenario.plan, seed=0)
    shards = sharded.local_shards()
    weights = [s.weight * 2 + 1 for s in shards]
    states = [torch.full_like(s.weight, 0.5) for s in shards]
    sharded.load_local_shards(weights, states)
    for shard, weight, state in zip(sharded.local_shards(), weights, states, strict=True):
        assert torch.equal(shard.weight, weight)
        assert shard.optimizer_state is not None and torch.equal(shard.optimizer_state, state)
    kept = [s.optimizer_state for s in sharded.local_shards()]
    sharded.load_local_shards(weights, [None] * len(weights))  # None keeps the state
    assert all(
        a is not None and b is not None and torch.equal(a, b)
        for a, b in zip(kept, [s.optimizer_state for s in sharded.local_shards()], strict=True)
    )
    with pytest.raises(ConfigError, match=f"this rank holds {len(shards)} blocks"):
        sharded.load_local_shards(weights[:-1], states[:-1])


@pytest.mark.multiprocess
def test_loading_blocks_round_trips_and_checks_the_count() -> None:
    run_gloo_ranks(_load_round_trip, 2)
