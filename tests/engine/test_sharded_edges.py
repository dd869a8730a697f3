"""Edge cases: out-of-range IDs, non-finite payloads, bad configuration, torchrec DLRM drop-in."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, Compression, Plan
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, concat_batches, random_batches
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

SGD = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.1)


def _with_id(batch: KeyedJaggedTensor, key: str, new_id: int) -> KeyedJaggedTensor:
    """``batch`` with the first ID of ``key`` replaced (the key must have an ID)."""
    lengths = batch.lengths().reshape(len(batch.keys()), -1)
    index = batch.keys().index(key)
    assert lengths[index].sum() > 0
    values = batch.values().clone()
    values[int(lengths[:index].sum())] = new_id
    return KeyedJaggedTensor(
        keys=batch.keys(), values=values, lengths=batch.lengths(), stride=batch.stride()
    )


def _out_of_range(rank: int, world: int) -> None:
    # (cluster type of the main cluster, feature with the bad ID on rank 0,
    #  bad ID = row count or negative)
    for cluster, key, bad_id in (("rb", "rwr", 26), ("ub", "tw", -3), ("rb", "dp", 9)):
        scenario = all_layouts_plan(world, 2, cluster)
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=scenario.tables)
        sharded = ShardedEmbeddingBagCollection.from_ebc(ebc, scenario.plan, sparse_optimizer=SGD)
        before = [s.weight.clone() for s in sharded.local_shards()]
        good = random_batches(scenario, [4] * world, seed=1)
        if rank == 0:
            # Only rank 0 has a bad ID: it names it, the others refuse too (nothing hangs).
            with pytest.raises(
                ConfigError, match=f"ID {bad_id} is out of range for table '{key}' with"
            ):
                sharded(_with_id(good[0], key, bad_id))
        else:
            with pytest.raises(ConfigError, match=r"rank\(s\) \[0\] rejected their local batch"):
                sharded(good[rank])
        # Nothing was sent or updated; the module keeps working in step with its peers.
        assert all(
            torch.equal(a, s.weight) for a, s in zip(before, sharded.local_shards(), strict=False)
        )
        expected = ebc(concat_batches(good)).values().detach()
        torch.testing.assert_close(sharded(good[rank]).values(), expected[4 * rank : 4 * rank + 4])


@pytest.mark.multiprocess
def test_out_of_range_ids_raise_a_clear_error_on_every_rank() -> None:
    run_gloo_ranks(_out_of_range, 2)


def _nonfinite(rank: int, world: int) -> None:
    for cluster, compression in (
        ("rb", Compression.FP32),
        ("rb", Compression.FP8),
        ("ub", Compression.INT8),
    ):
        scenario = all_layouts_plan(world, 2, cluster, forward=compression, backward=compression)
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=scenario.tables)
        with torch.no_grad():
            ebc.embedding_bags["t_tw"].weight[19, 2] = float(
                "nan"
            )  # tw's last row, owned by rank 1
            ebc.embedding_bags["t_tw"].weight[19, 5] = float("inf")
        sharded = ShardedEmbeddingBagCollection.from_ebc(ebc, scenario.plan, sparse_optimizer=SGD)
        batches = random_batches(scenario, [4] * world, seed=2)  # every rank asks for row 19 of tw
        expected = ebc(concat_batches(batches)).values().detach()[4 * rank : 4 * rank + 4]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = sharded(batches[rank]).values().detach()
        # Documented: NaN travels as 0 and inf saturates (codec policy); the encoding
        # rank counts and warns.
        assert torch.isfinite(out).all()
        tw = slice(0, 8)  # first feature
        poisoned = ~torch.isfinite(expected[:, tw]).all(1)
        assert poisoned.any()
        if cluster == "rb":  # owners pool first: the bag's NaN column travels as 0
            assert (out[poisoned, 2] == 0).all()
        if compression is Compression.FP32:
            assert (out[poisoned, 5] == torch.finfo(torch.float32).max).all()
            torch.testing.assert_close(out[~poisoned], expected[~poisoned])
            clean = [c for c in range(8) if c not in (2, 5)]
            torch.testing.assert_close(out[poisoned][:, clean], expected[poisoned][:, clean])
        owner = world - 1
        if rank == owner:
            assert sharded.nonfinite_count > 0
            assert any("non-finite" in str(w.message) for w in caught)
        else:
            assert sharded.nonfinite_count == 0


@pytest.mark.multiprocess
def test_nonfinite_payloads_are_sanitised_counted_and_warned() -> None:
    run_gloo_ranks(_nonfinite, 2)


def _dlrm(rank: int, world: int) -> None:
    configs = [
        EmbeddingBagConfig(
            name=f"t_f{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"f{i}"]
        )
        for i, rows in enumerate([40, 25, 60, 12])
    ]
    tables = (
        layouts.row_wise("f0", "rb", range(world)),
        layouts.column_wise("f1", "rb", range(world)),
        layouts.table_wise("f2", "ub", world - 1),
        layouts.data_parallel("f3", "dp", world),
    )
    plan = Plan(
        world_size=world,
        ranks_per_host=2,
        tables=tables,
        clusters=(
            ClusterPlan(name="rb", type="rb"),
            ClusterPlan(name="ub", type="ub"),
            ClusterPlan(name="dp", type="dp"),
        ),
    )
    group = dist.new_group(list(range(world)))
    for kind in (DLRM, DLRM_DCN):
        torch.manual_seed(0)
        extra = {"dcn_num_layers": 2, "dcn_low_rank_dim": 4} if kind is DLRM_DCN else {}
        reference = kind(
            embedding_bag_collection=EmbeddingBagCollection(tables=configs),
            dense_in_features=5,
            dense_arch_layer_sizes=[16, 8],
            over_arch_layer_sizes=[16, 1],
            **extra,
        )
        torch.manual_seed(0)
        model = kind(
            embedding_bag_collection=EmbeddingBagCollection(tables=configs),
            dense_in_features=5,
            dense_arch_layer_sizes=[16, 8],
            over_arch_layer_sizes=[16, 1],
            **extra,
        )
        ebc = model.sparse_arch.embedding_bag_collection
        model.sparse_arch.embedding_bag_collection = ShardedEmbeddingBagCollection.from_ebc(
            ebc, plan, sparse_optimizer=SGD, process_group=group
        )  # a group of its own, as next to DDP
        optimizer = ReferenceOptimizer(reference.sparse_arch.embedding_bag_collection, SGD)
        g = torch.Generator().manual_seed(5)
        keys = [f"f{i}" for i in range(4)]
        lengths = torch.randint(0, 4, (4 * 4 * world,), generator=g)
        per_rank = lengths.reshape(4, world, 4)
        rows = torch.tensor([40, 25, 60, 12]).repeat_interleave(4 * world)
        values = (
            torch.rand(int(lengths.sum()), generator=g) * rows.repeat_interleave(lengths)
        ).long()
        dense = torch.randn(4 * world, 5, generator=g)
        global_kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride=4 * world)
        local = _local_slice(global_kjt, per_rank, rank)
        logits = reference(dense, global_kjt)
        logits.sum().backward()
        optimizer.step()
        mine = model(dense[4 * rank : 4 * rank + 4], local)
        torch.testing.assert_close(
            mine, logits[4 * rank : 4 * rank + 4].detach(), rtol=1e-5, atol=1e-6
        )
        mine.sum().backward()
        for shard in model.sparse_arch.embedding_bag_collection.local_shards():
            full = reference.sparse_arch.embedding_bag_collection.embedding_bags[
                f"t_{shard.table}"
            ].weight.detach()
            torch.testing.assert_close(
                shard.weight, full[shard.rows, shard.col_start : shard.col_end]
            )


def _local_slice(kjt: KeyedJaggedTensor, per_rank: torch.Tensor, rank: int) -> KeyedJaggedTensor:
    values = torch.split(kjt.values(), per_rank.reshape(-1, per_rank.shape[-1]).sum(1).tolist())
    world = per_rank.shape[1]
    mine = [values[key * world + rank] for key in range(per_rank.shape[0])]
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.cat(mine),
        lengths=per_rank[:, rank].reshape(-1),
        stride=per_rank.shape[-1],
    )


@pytest.mark.multiprocess
def test_torchrec_dlrm_and_dcn_run_unchanged_and_match() -> None:
    run_gloo_ranks(_dlrm, 2)


def _bad_config(rank: int, world: int) -> None:
    scenario = all_layouts_plan(2, 2, "rb")
    with pytest.raises(ConfigError, match="plan is for 2 ranks but the process group has 1"):
        ShardedEmbeddingBagCollection(scenario.tables, scenario.plan, sparse_optimizer=SGD)
    one = all_layouts_plan(1, 1, "rb")
    with pytest.raises(ConfigError, match="weighted features need SUM pooling"):
        ShardedEmbeddingBagCollection(one.tables, one.plan, sparse_optimizer=SGD, is_weighted=True)
    narrow = [
        EmbeddingBagConfig(name="t_x", num_embeddings=5, embedding_dim=6, feature_names=["x"])
    ]
    plan = Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="c", type="rb"),),
        tables=(layouts.table_wise("x", "c", 0),),
    )
    with pytest.raises(ConfigError, match="multiples of 4"):
        ShardedEmbeddingBagCollection(
            narrow, plan, sparse_optimizer=SGD, config=EngineConfig(store="fbgemm")
        )
    missing = Plan(
        world_size=1, ranks_per_host=1, clusters=(ClusterPlan(name="c", type="rb"),), tables=()
    )
    with pytest.raises(ConfigError, match="missing from the plan"):
        ShardedEmbeddingBagCollection(one.tables, missing, sparse_optimizer=SGD)
    with pytest.raises(ConfigError, match="sparse optimizer kind 'adam' is unknown"):
        SparseOptimizer(kind="adam")


def test_configuration_errors_name_the_fix() -> None:
    run_gloo_ranks(_bad_config, 1)


def _meta_init(rank: int, world: int) -> None:
    scenario = all_layouts_plan(world, 2, "rb")
    ebc = EmbeddingBagCollection(tables=scenario.tables, device=torch.device("meta"))
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, scenario.plan, sparse_optimizer=SGD, config=EngineConfig(seed=3)
    )
    shards = {(s.table, s.row_shard, s.col_shard): s.weight for s in sharded.local_shards()}
    gathered = [None] * world
    dist.all_gather_object(gathered, shards)
    # Replicas of a block start identical, whichever rank holds them; init is seeded per table.
    rep = [g[("rep", 0, 0)] for g in gathered]
    assert torch.equal(rep[0], rep[1])
    assert all(w.abs().max() <= (1 / 17) ** 0.5 for w in rep)
    batch = random_batches(scenario, [3] * world, seed=4)[rank]
    out = sharded(batch)
    out.values().sum().backward()
    out = sharded(batch)
    out.values().sum().backward(retain_graph=True)
    with pytest.raises(ConfigError, match="backward ran twice"):
        out.values().sum().backward()


@pytest.mark.multiprocess
def test_meta_collections_get_a_deterministic_replica_consistent_init() -> None:
    run_gloo_ranks(_meta_init, 2)
