"""torchrec's own tower sharding on CPU/gloo: towers placed in order, identity towers
refused, and a towered DLRM sharded by torchrec equal to the unsharded one."""

from __future__ import annotations

import copy
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed.embedding_tower_sharding import ShardedEmbeddingTowerCollection
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_row_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.baseline import (
    TowerCollectionSharder,
    apply_sparse_optimizer,
    check_tower_modules,
    make_sharders,
    order_towers_by_host,
    plan_with_torchrec,
    release_node_groups,
    shard_module,
    sync_local_world_size,
    to_torchrec_topology,
)
from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.models._tower_dlrm import tower_collection
from lightning_embark.plan import TowerModule, TowerRequest, save_towers
from lightning_embark.testing import run_gloo_ranks
from lightning_embark.topology import topology_preset

DIM = 8
HOSTS, LOCAL = 2, 2
WORLD = HOSTS * LOCAL
BATCH = 8


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t_{n}", num_embeddings=30 + i, embedding_dim=DIM, feature_names=[n]
        )
        for i, n in enumerate("abcd")
    ]


def _collection(module: TowerModule) -> Any:
    width = {} if module is TowerModule.IDENTITY else {"output_ratio": 2.0}
    requests = [
        TowerRequest(name="x", tables=("a", "b"), module=module, **width),
        TowerRequest(name="y", tables=("c", "d"), module=module, **width),
    ]
    collection, _ = tower_collection(_configs(), requests, dim=DIM, device=torch.device("meta"))
    return collection


def test_towers_go_to_the_planners_hosts_in_their_own_order() -> None:
    """Tower 0 planned on host 1 and tower 1 on host 0 (what torchrec's planner chose for
    such a model, measured) swap hosts: each table keeps its layout inside the host and
    moves by one host, ``L`` ranks."""
    holder = torch.nn.Module()
    holder.towers = _collection(TowerModule.PROJECTION)
    hosts = {"t_a": 1, "t_b": 1, "t_c": 0, "t_d": 0}
    module_plan = construct_module_sharding_plan(
        holder.towers,
        {name: table_row_wise(host) for name, host in hosts.items()},
        sharder=TowerCollectionSharder(),
        local_size=LOCAL,
        world_size=WORLD,
        device_type="cpu",
    )
    before = copy.deepcopy(module_plan)
    plan = order_towers_by_host(
        ShardingPlan({"towers": module_plan}), holder, ranks_per_host=LOCAL
    )
    moved = plan.plan["towers"]
    for name, host in hosts.items():
        target = 0 if host == 1 else 1
        shift = (target - host) * LOCAL
        assert moved[name].ranks == [r + shift for r in before[name].ranks]
        assert moved[name].sharding_type == before[name].sharding_type == "table_row_wise"
        old, new = before[name].sharding_spec.shards, moved[name].sharding_spec.shards
        assert [s.shard_sizes for s in new] == [s.shard_sizes for s in old]
        assert [s.shard_offsets for s in new] == [s.shard_offsets for s in old]
        assert [s.placement.rank() for s in new] == [s.placement.rank() + shift for s in old]
    # Already in order: nothing moves.
    again = order_towers_by_host(copy.deepcopy(plan), holder, ranks_per_host=LOCAL)
    assert {n: p.ranks for n, p in again.plan["towers"].items()} == {
        n: p.ranks for n, p in moved.items()
    }


def test_identity_towers_are_refused_with_the_reason() -> None:
    identity = _collection(TowerModule.IDENTITY)
    with pytest.raises(ConfigError, match=r"tower 0 .* without trainable parameters") as caught:
        check_tower_modules(identity)
    assert "embedding_tower_sharding.py:604" in str(caught.value)
    assert "projection or dcn" in str(caught.value)
    # The sharder refuses before touching a process group.
    with pytest.raises(ConfigError, match="without trainable parameters"):
        TowerCollectionSharder().shard(identity, {}, env=None)  # type: ignore[arg-type]
    check_tower_modules(_collection(TowerModule.PROJECTION))


def _copy_tables(sharded: torch.nn.Module, reference: DLRMModule) -> None:
    """Each rank's shards of every table set to the reference's rows and columns."""
    full = {
        key.split(".")[-2]: value
        for key, value in reference.state_dict().items()
        if "embedding_bags" in key
    }
    with torch.no_grad():
        for key, value in sharded.state_dict().items():
            if "embedding_bags" not in key:
                continue
            table = full[key.split(".")[-2]]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    (r, c), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(table[r : r + nr, c : c + nc])
            else:
                value.copy_(table)


def _check(rank: int, world: int, synthetic: Any, towers: str) -> None:
    """The comparison, then the release of torchrec's node groups: torchrec keeps them in
    module globals, so without it they (their gloo threads and sockets) would live into the
    interpreter's exit (see :func:`~lightning_embark.baseline.release_node_groups`)."""
    _compare(rank, world, synthetic, towers)
    from torchrec.distributed import comm

    made = [weakref.ref(g) for g in (comm._INTRA_PG, comm._CROSS_PG) if g is not None]
    assert len(made) == 2  # the tower sharding's host and cross-host groups
    release_node_groups()
    gc.collect()  # the sharded modules went with _compare's frame, some in reference cycles
    assert comm._INTRA_PG is None and comm._CROSS_PG is None
    assert [r() for r in made] == [None, None], "a released group is still alive"


def _compare(rank: int, world: int, synthetic: Any, towers: str) -> None:
    spec = synthetic.tiny_spec(num_tables=5, rows=60, dim=DIM, num_dense=4)
    torch.manual_seed(0)
    reference = DLRMModule(
        spec, towers=towers, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1]
    )
    reference.materialize_embeddings()
    module = copy.deepcopy(reference)
    sparse = module.sparse_optimizer_spec()
    apply_sparse_optimizer(module.embedding_modules().values(), sparse)
    sharders = make_sharders(device=torch.device("cpu"), fused_params=sparse.fused_params())
    topology = topology_preset("emulated", num_hosts=HOSTS, ranks_per_host=LOCAL)
    pg = dist.GroupMember.WORLD
    assert pg is not None
    plan = plan_with_torchrec(
        module,
        sharders,
        topology=to_torchrec_topology(topology, compute_device="cpu"),
        batch_size=BATCH,
        pg=pg,
    )
    sync_local_world_size(LOCAL)
    dmp = shard_module(module, plan=plan, sharders=sharders, device=torch.device("cpu"), pg=pg)
    assert isinstance(module.model.towers, ShardedEmbeddingTowerCollection)
    tower_hosts = [
        {r // LOCAL for n in tables for r in plan.plan["model.towers"][f"t_{n}"].ranks}
        for tables in (("f0", "f1"), ("f2", "f3"))
    ]
    assert tower_hosts == [{0}, {1}], tower_hosts
    _copy_tables(module, reference)

    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(BATCH, 4, generator=generator), synthetic.random_kjt(spec, BATCH, generator))
        for _ in range(world)
    ]
    dense, sparse_features = batches[rank]
    out = dmp(dense, sparse_features)
    expected = reference(dense, sparse_features)
    # Same fp32 products; only the association of a bag's sum changes where a table's rows
    # are split over a host (partial sums per shard, then added): a few ulps of values of
    # order 1, carried through two small MLPs, so 1e-5 relative and 1e-6 absolute.
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)

    # Tower modules follow DDP's mean over the W ranks, like the dense part: the gradient
    # is the global batch's summed gradient divided by W (the host all-reduce averages over
    # L, torchrec divides by H in the output exchange's backward). Sums of W * BATCH = 32
    # fp32 terms in another order: 1e-5 relative.
    out.sum().backward()
    reference.zero_grad()
    for d, s in batches:
        reference(d, s).sum().backward()
    ((index, local),) = module.model.towers.interactions.items()  # this host's tower
    mine, theirs = local.module, reference.model.towers.towers[int(index)].interaction
    assert int(index) == rank // LOCAL
    for got, want in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad / world, rtol=1e-5, atol=1e-7)

    # The tower modules train with the dense optimizer, though the sharded collection
    # hides its parameters from named_parameters() above it.
    optimizer = module.configure_optimizers()
    groups = getattr(optimizer, "optimizers", [optimizer])
    dense_ids = {id(p) for g in groups[0].param_groups for p in g["params"]}
    towers = module.model.towers.interactions
    assert all(id(p) in dense_ids for p in towers.parameters())
    assert not any(
        id(p) in dense_ids for g in groups[1:] for x in g.param_groups for p in x["params"]
    )


@pytest.mark.multiprocess
def test_a_towered_dlrm_under_torchrecs_tower_sharding_equals_the_unsharded_one(
    synthetic: Any, tmp_path: Path
) -> None:
    """2 hosts x 2 ranks: projection towers (f0, f1) and (f2, f3), f4 flat."""
    towers = tmp_path / "towers.json"
    save_towers(
        [
            TowerRequest(name="x", tables=("f0", "f1"), module="projection", output_ratio=2.0),
            TowerRequest(name="y", tables=("f2", "f3"), module="projection", output_ratio=2.0),
        ],
        towers,
    )
    run_gloo_ranks(_check, WORLD, synthetic, str(towers))
