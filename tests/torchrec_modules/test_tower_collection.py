"""torchrec's ``EmbeddingTowerCollection`` sharded by the engine equals the unsharded one.

Two ``EmbeddingTower`` s (a projection and a DCN-style interaction over their
``KeyedTensor``) on 2 hosts x 2 ranks and 4 x 1: forward outputs, the interaction
modules' parameters and the tables after 3 SGD steps on both sides. Tolerance as in
:mod:`tests.engine.test_towers` (relative ``8 * steps * n * u``, ``n`` the longest
reduction of a step).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedTensor

from lightning_embark.engine import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.plan import restrict
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import concat_batches, random_batches
from lightning_embark.testing._tower_scenarios import towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingTowerCollection, output_width

STEPS = 3
TOLERANCE = 8 * STEPS * 104 * 2.0**-24
OUT = 6


class Interaction(nn.Module):
    """A tower's interaction over its KeyedTensor: features times a learned gate, projected."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, width)
        self.out = nn.Linear(width, OUT)

    def forward(self, embeddings: KeyedTensor) -> torch.Tensor:
        x = embeddings.values()
        return self.out(x + x * self.gate(x))


def _collection(scenario) -> EmbeddingTowerCollection:
    by_name = {c.name: c for c in scenario.tables}
    towers = []
    for tower in scenario.plan.towers:
        configs = [by_name[f"t_{t}"] for t in tower.tables]
        width = sum(c.embedding_dim * len(c.feature_names) for c in configs)
        towers.append(EmbeddingTower(EmbeddingBagCollection(tables=configs), Interaction(width)))
    return EmbeddingTowerCollection(towers)


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    error = float((actual - expected).norm() / expected.norm().clamp_min(1e-12))
    assert error <= TOLERANCE, f"{what}: relative error {error:.3g} > {TOLERANCE:.3g}"


def _check(rank: int, world: int, local: int) -> None:
    scenario = towers_plan(world, local, module="custom", output_dim=OUT)
    tower_tables = [t for tower in scenario.plan.towers for t in tower.tables]
    plan = restrict(scenario.plan, tower_tables)
    torch.manual_seed(5)
    etc = _collection(scenario)
    reference = copy.deepcopy(etc)
    optimizer = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.05)
    sharded = ShardedEmbeddingTowerCollection.from_etc(etc, plan, sparse_optimizer=optimizer)
    tables = [t.embedding for t in reference.towers]
    sparse = [ReferenceOptimizer(ebc, optimizer) for ebc in tables]
    dense = torch.optim.SGD(
        [p for t in reference.towers for p in t.interaction.parameters()], lr=0.05
    )
    mine_dense = torch.optim.SGD(sharded.towers.parameters(), lr=0.05)
    scenario_keys = type(scenario)(
        tables=[c for t in tables for c in t.embedding_bag_configs()], plan=plan
    )
    for step in range(STEPS):
        sizes = [4] * world
        if step == 1:
            sizes[0] = 0
        local_batches = random_batches(scenario_keys, sizes, seed=step + 3)
        expected = reference(concat_batches(local_batches))
        upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(step))
        (expected * upstream).sum().backward()
        for s in sparse:
            s.step()
        dense.step()
        dense.zero_grad()
        mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        out = sharded(local_batches[rank])
        assert out.shape == (sizes[rank], 2 * OUT)
        if sizes[rank]:
            _close(out, expected[mine].detach(), f"step {step} forward")
        (out * upstream[mine]).sum().backward()
        mine_dense.step()
        mine_dense.zero_grad()
    sharded.sync_tower_modules()
    for i, name in enumerate(sharded._order):
        for p, q in zip(
            sharded.towers[name].parameters(),
            reference.towers[i].interaction.parameters(),
            strict=True,
        ):
            _close(p.detach(), q.detach(), f"{name} parameters")
    full = {
        c.name: t.embedding_bags[c.name].weight.detach()
        for t in tables
        for c in t.embedding_bag_configs()
    }
    for shard in sharded.local_shards():
        _close(
            shard.weight,
            full[f"t_{shard.table}"][shard.rows, shard.col_start : shard.col_end],
            shard.table,
        )


@pytest.mark.multiprocess
@pytest.mark.parametrize("local", [2, 1])
def test_a_sharded_tower_collection_equals_torchrecs(local: int) -> None:
    run_gloo_ranks(_check, 4, local)


def test_tower_collection_mistakes_are_named() -> None:
    scenario = towers_plan(2, 1, module="custom", output_dim=OUT)
    etc = _collection(scenario)
    assert (
        output_width(etc.towers[0].interaction, etc.towers[0].embedding.embedding_bag_configs())
        == OUT
    )
    identity = towers_plan(2, 1)
    with pytest.raises(ConfigError, match="is 'identity' but EmbeddingTower 0 has an interaction"):
        ShardedEmbeddingTowerCollection.from_etc(
            etc, identity.plan, sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=0.1)
        )
