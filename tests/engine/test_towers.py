"""Towers against the unsharded model: the transform is exact, tower modules train alike.

Identity towers: the sharded module must equal ONE unsharded ``EmbeddingBagCollection``
fed the global batch (forward outputs and every block's weights after each of 3
optimizer steps), on 2 hosts x 2 ranks, 4 x 1 (the middle hosts hold no tower) and
1 x 4 (both towers on the one host), with DP, RB and UB tables inside towers, row and
column splits inside the host, flat features beside them, empty bags and a rank with
no samples. The bounds are the engine's exactness bounds
(:mod:`lightning_embark.testing._tolerance`): a tower only moves where rows are pooled
and gradients summed, which fp32 rounds differently by at most ``2 gamma(n - 1)
sum(|terms|)`` per sum, carried through the optimizer's slope (SGD: ``lr``).

Projection and DCN towers: the sharded module must equal a single-process model made
of the same collection and the same tower modules on the global batch (forward, tower
parameters and table weights after 3 SGD steps on both). The two compute the same
sums in other orders; each value of a step is a sum of at most ``n`` terms (``n`` = the
longest reduction of the step: ``N * max_bag + D``, here at most 20 * 4 + 24 = 104), so
it differs by at most ``gamma(n) ~ n u`` relative to the sum of its terms' magnitudes;
across 3 steps and the cross term's products that stays below ``8 * 3 * n * u``
(``u = 2**-24``): ``1.5e-4`` in relative norm. A wrong gradient scale, a missing
intra-host sum or a misrouted sample is off by O(1).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.plan import TowerModule, layouts
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import concat_batches, random_batches
from lightning_embark.testing._tolerance import (
    assert_within,
    gradient_terms,
    pooled_bound,
    rounding_bound,
    step_bound,
)
from lightning_embark.testing._tower_scenarios import tower_reference, towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

BATCH = 5
STEPS = 3
MODULE_TOLERANCE = 8 * STEPS * 104 * 2.0**-24


def _sizes(world: int, step: int) -> list[int]:
    sizes = [BATCH] * world
    if step == 1 and world > 1:
        sizes[world - 1] = 0  # a rank with no samples
    return sizes


def _identity(rank: int, world: int, local: int, kind: OptimizerKind) -> None:
    scenario = towers_plan(world, local, hierarchical=local < world)
    torch.manual_seed(1234)
    ebc = EmbeddingBagCollection(tables=scenario.tables)
    optimizer = SparseOptimizer(kind=kind, lr=0.05, eps=0.05)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, scenario.plan, sparse_optimizer=optimizer
    )
    reference = ReferenceOptimizer(ebc, optimizer)
    width = sum(t.embedding_dim * len(t.feature_names) for t in scenario.tables)
    tables = {c.name: ebc.embedding_bags[c.name].weight for c in scenario.tables}
    order_bound = {n: torch.zeros(w.shape, dtype=torch.float64) for n, w in tables.items()}
    moved = {n: torch.zeros(w.shape, dtype=torch.float64) for n, w in tables.items()}
    for step in range(STEPS):
        sizes = _sizes(world, step)
        local_batches = random_batches(scenario, sizes, seed=10 * step + world)
        upstream = torch.randn(sum(sizes), width, generator=torch.Generator().manual_seed(step))
        mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        global_batch = concat_batches(local_batches)
        weight_bound = {
            n: order_bound[n] + rounding_bound(w.detach(), moved[n]) for n, w in tables.items()
        }
        forward_bound = pooled_bound(scenario.tables, global_batch, tables, weight_bound)
        expected = ebc(global_batch)
        (expected.values() * upstream).sum().backward()
        before = {n: w.detach().clone() for n, w in tables.items()}
        reference.step()
        for n, (abs_sum, count) in gradient_terms(scenario.tables, global_batch, upstream).items():
            order_bound[n] = step_bound(order_bound[n], optimizer, abs_sum, count)
            moved[n] += (tables[n].detach() - before[n]).abs()

        out = sharded(local_batches[rank])
        assert out.keys() == expected.keys()
        assert out.length_per_key() == expected.length_per_key()
        assert_within(
            out.values(), expected.values()[mine].detach(), forward_bound[mine], f"step {step}"
        )
        (out.values() * upstream[mine]).sum().backward()
        for shard in sharded.local_shards():
            name = f"t_{shard.table}"
            block = (shard.rows, slice(shard.col_start, shard.col_end))
            bound = order_bound[name] + rounding_bound(tables[name].detach(), moved[name])
            assert_within(
                shard.weight,
                tables[name].detach()[block],
                bound[block],
                f"step {step} table {shard.table} block ({shard.replica},{shard.row_shard},"
                f"{shard.col_shard})",
            )


def _relative(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    error = float((actual - expected).norm() / expected.norm().clamp_min(1e-12))
    assert error <= MODULE_TOLERANCE, (
        f"{what}: relative error {error:.3g} > {MODULE_TOLERANCE:.3g}"
    )


def _modules(rank: int, world: int, local: int, module: str) -> None:
    scenario = towers_plan(world, local, module=module, output_dim=6)
    torch.manual_seed(1234)
    ebc = EmbeddingBagCollection(tables=scenario.tables)
    optimizer = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.05)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, scenario.plan, sparse_optimizer=optimizer
    )
    # The single-process model: the same tables and the same (rank 0's) tower modules.
    modules = {name: copy.deepcopy(m) for name, m in sharded.towers.items()}
    if module == "dcn":  # start the cross term away from zero so it is exercised
        torch.manual_seed(7)
        for pair in zip(modules.values(), sharded.towers.values(), strict=True):
            w = torch.randn_like(pair[0].cross.weight) * 0.1
            for m in pair:
                m.cross.weight.data.copy_(w)
    reference = ReferenceOptimizer(ebc, optimizer)
    dense = torch.optim.SGD([p for m in modules.values() for p in m.parameters()], lr=0.05)
    sharded_dense = torch.optim.SGD(sharded.towers.parameters(), lr=0.05)
    for step in range(STEPS):
        sizes = _sizes(world, step)
        local_batches = random_batches(scenario, sizes, seed=10 * step + world)
        global_batch = concat_batches(local_batches)
        keys, expected = tower_reference(ebc, scenario.plan, modules, global_batch)
        upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(step))
        mine = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        (expected * upstream).sum().backward()
        reference.step()
        dense.step()
        dense.zero_grad()

        out = sharded(local_batches[rank])
        assert out.keys() == keys
        if sizes[rank]:
            _relative(out.values(), expected[mine].detach(), f"{module} step {step} forward")
        (out.values() * upstream[mine]).sum().backward()
        sharded_dense.step()
        sharded_dense.zero_grad()
        host = rank // local
        for tower in scenario.plan.towers:
            if tower.host != host:
                continue  # a tower module trains on its host's ranks only
            for (name, p), q in zip(
                sharded.towers[tower.name].named_parameters(),
                modules[tower.name].parameters(),
                strict=True,
            ):
                _relative(p.detach(), q.detach(), f"{module} step {step} {tower.name}.{name}")
        for shard in sharded.local_shards():
            full = ebc.embedding_bags[f"t_{shard.table}"].weight.detach()
            block = full[shard.rows, shard.col_start : shard.col_end]
            _relative(shard.weight, block, f"{module} step {step} table {shard.table}")
    # After a sync every rank holds the trained modules (what a checkpoint saves).
    sharded.sync_tower_modules()
    for name, m in sharded.towers.items():
        for p, q in zip(m.parameters(), modules[name].parameters(), strict=True):
            _relative(p.detach(), q.detach(), f"{module} synced {name}")


@pytest.mark.multiprocess
def test_identity_towers_two_hosts_of_two_equal_the_flat_model() -> None:
    run_gloo_ranks(_identity, 4, 2, OptimizerKind.ROWWISE_ADAGRAD)


@pytest.mark.multiprocess
def test_identity_towers_four_hosts_of_one_equal_the_flat_model() -> None:
    run_gloo_ranks(_identity, 4, 1, OptimizerKind.SGD)


@pytest.mark.multiprocess
def test_identity_towers_one_host_of_four_equal_the_flat_model() -> None:
    run_gloo_ranks(_identity, 4, 4, OptimizerKind.ADAGRAD)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("local", "module"), [(2, "projection"), (1, "dcn"), (2, "dcn"), (2, "dot"), (1, "dot")]
)
def test_tower_modules_train_as_in_one_process(local: int, module: str) -> None:
    run_gloo_ranks(_modules, 4, local, module)


def _bad_ids(rank: int, world: int, flat_exchange: bool) -> None:
    scenario = towers_plan(world, 2)
    plan = scenario.plan
    if not flat_exchange:  # only DP outside the towers: the towers' header must tell all
        plan = dataclasses.replace(
            plan,
            tables=tuple(
                layouts.data_parallel("e", "flatdp", world) if t.table == "e" else t
                for t in plan.tables
            ),
        )
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=scenario.tables)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, plan, sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD, lr=0.1)
    )
    batch = random_batches(scenario, [3] * world, seed=1)[rank]
    if rank == 3:  # an out-of-range ID in the first tower feature this rank has IDs of
        values, offsets = batch.values().clone(), batch.offset_per_key()
        key = next(
            k
            for k, (start, stop) in enumerate(itertools.pairwise(offsets))
            if stop > start and plan.tower_of(batch.keys()[k].rstrip("12")) is not None
        )
        values[offsets[key]] = 10_000
        batch = KeyedJaggedTensor(
            keys=batch.keys(), values=values, lengths=batch.lengths(), stride=batch.stride()
        )
    match = "is out of range" if rank == 3 else r"rank\(s\) \[3\] rejected their local batch"
    with pytest.raises(ConfigError, match=match):
        sharded(batch)


@pytest.mark.multiprocess
@pytest.mark.parametrize("flat_exchange", [True, False])
def test_a_bad_id_in_a_tower_feature_stops_every_rank(flat_exchange: bool) -> None:
    run_gloo_ranks(_bad_ids, 4, flat_exchange)


def _config_errors(rank: int, world: int) -> None:
    scenario = towers_plan(world, 1, module=TowerModule.CUSTOM, output_dim=3)
    ebc = EmbeddingBagCollection(tables=scenario.tables, device=torch.device("meta"))
    optimizer = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.1)
    with pytest.raises(ConfigError, match="tower 't0' is 'custom' but no module was given"):
        ShardedEmbeddingBagCollection.from_ebc(ebc, scenario.plan, sparse_optimizer=optimizer)
    with pytest.raises(ConfigError, match=r"tower modules given for \['nope'\]"):
        ShardedEmbeddingBagCollection(
            ebc.embedding_bag_configs(),
            scenario.plan,
            sparse_optimizer=optimizer,
            tower_modules={"nope": torch.nn.Identity()},
        )
    wrong = ShardedEmbeddingBagCollection(
        ebc.embedding_bag_configs(),
        scenario.plan,
        sparse_optimizer=optimizer,
        tower_modules={"t0": torch.nn.Linear(24, 5), "t1": torch.nn.Linear(24, 3)},
    )
    batch = random_batches(scenario, [2] * world, seed=0)[rank]
    with pytest.raises(ConfigError, match=r"tower 't0': its module returned shape \(2, 5\)"):
        wrong(batch)


@pytest.mark.multiprocess
def test_tower_module_mistakes_name_the_tower() -> None:
    run_gloo_ranks(_config_errors, 1)
