"""The rule-based automatic plan: cluster choice, compression, layout, and an end-to-end run."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import ClusterType, Compression, Plan
from lightning_embark.planner._rules import best_compression, rule_based_plan
from lightning_embark.spec import load_spec
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.topology import topology_preset
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection


def _cluster_of(plan: Plan, table: str) -> ClusterType:
    return plan.cluster(plan.layout(table).cluster).type


def test_rules_choose_dp_ub_rb_compression_and_hierarchy() -> None:
    spec = load_spec("demo-small")
    plan = rule_based_plan(
        spec,
        (2, 2),
        unique_ratios={"f3": 0.05, "f0": 1.0},
        allow={"fp16", "bf16"},
        dp_max_rows=10_000,
    )
    assert {t: _cluster_of(plan, t) for t in spec.feature_names} == {
        "f0": ClusterType.RB,
        "f1": ClusterType.DP,
        "f2": ClusterType.DP,
        "f3": ClusterType.UB,
        "f4": ClusterType.DP,
        "f5": ClusterType.RB,
        "f6": ClusterType.DP,
        "f7": ClusterType.RB,
    }
    rb = plan.cluster("rb")
    assert (rb.forward_compression, rb.backward_compression, rb.hierarchical) == (
        Compression.FP16,
    ) * 2 + (True,)
    assert plan.layout("f3").num_row_shards == 4  # UB: split over every rank
    assert plan.layout("f0").num_row_shards == 1  # RB: whole tables, balanced
    owners = sorted(plan.layout(t).ranks[0][0] for t in ("f0", "f5", "f7"))
    assert len(set(owners)) == 3
    assert Plan.from_dict(plan.to_dict()) == plan
    single_host = rule_based_plan(spec, topology_preset("emulated", num_hosts=1, ranks_per_host=4))
    assert (
        _cluster_of(single_host, "f2") is ClusterType.DP
        and _cluster_of(single_host, "f1") is ClusterType.RB
    )
    assert not single_host.cluster("rb").hierarchical
    assert single_host.cluster("rb").forward_compression is Compression.FP32
    assert [c.name for c in single_host.clusters] == ["dp", "rb"]


def test_oversized_rb_tables_split_inside_one_host() -> None:
    spec = load_spec("demo-small")
    plan = rule_based_plan(spec, (2, 2), dp_max_rows=0)
    f3 = plan.layout("f3")  # 50k of 134k rows: more than a quarter, so split by rows
    assert f3.num_row_shards == 2 and len({r // 2 for r in f3.ranks[0]}) == 1  # table-row-wise
    owners = {t: plan.layout(t).ranks[0][0] for t in spec.feature_names if t != "f3"}
    assert set(owners.values()) == {0, 1, 2, 3}
    assert (
        rule_based_plan(spec, (1, 4), dp_max_rows=0).layout("f3").num_row_shards == 4
    )  # one host: row-wise


def test_best_compression_order() -> None:
    assert best_compression(None) is Compression.FP32
    assert best_compression({"int8", "fp16"}) is Compression.INT8
    assert best_compression({"fp8", "int8"}) is Compression.FP8


def test_bad_ratios_are_config_errors() -> None:
    spec = load_spec("demo-small")
    with pytest.raises(ConfigError, match="unique ratio of feature 'f0' must be in"):
        rule_based_plan(spec, (1, 2), unique_ratios={"f0": 0.0})
    with pytest.raises(ConfigError, match="features not in spec"):
        rule_based_plan(spec, (1, 2), unique_ratios={"nope": 0.5})


def _run(rank: int, world: int) -> None:
    spec = load_spec("demo-small", max_rows=300)
    plan = rule_based_plan(
        spec, (1, world), unique_ratios={"f3": 0.05}, dp_max_rows=150, row_split_bytes=0
    )
    assert {c.type for c in plan.clusters} == {ClusterType.DP, ClusterType.RB, ClusterType.UB}
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=spec.embedding_bag_configs())
    optimizer = SparseOptimizer(kind="rowwise_adagrad", lr=0.05)
    sharded = ShardedEmbeddingBagCollection.from_ebc(ebc, plan, sparse_optimizer=optimizer)
    reference = ReferenceOptimizer(ebc, optimizer)
    g = torch.Generator().manual_seed(1)
    batch = 4
    lengths = torch.randint(0, 4, (len(spec.tables), world, batch), generator=g)
    rows = torch.tensor([t.num_embeddings for t in spec.tables])
    for _ in range(2):
        values = [
            (torch.rand(int(lengths[t].sum()), generator=g) * rows[t]).long()
            for t in range(len(spec.tables))
        ]
        full = KeyedJaggedTensor(
            keys=spec.feature_names,
            values=torch.cat(values),
            lengths=lengths.reshape(-1),
            stride=world * batch,
        )
        mine_values = [
            torch.split(v, lengths[t].sum(1).tolist())[rank] for t, v in enumerate(values)
        ]
        mine = KeyedJaggedTensor(
            keys=spec.feature_names,
            values=torch.cat(mine_values),
            lengths=lengths[:, rank].reshape(-1),
            stride=batch,
        )
        expected = ebc(full).values()
        expected.sum().backward()
        reference.step()
        out = sharded(mine).values()
        torch.testing.assert_close(out, expected[rank * batch : (rank + 1) * batch].detach())
        out.sum().backward()
    for shard in sharded.local_shards():
        weight = ebc.embedding_bags[f"t_{shard.table}"].weight.detach()
        torch.testing.assert_close(
            shard.weight, weight[shard.rows, shard.col_start : shard.col_end]
        )


@pytest.mark.multiprocess
def test_rule_plan_runs_and_matches_unsharded() -> None:
    """The loss is ``out.sum()``, so every row's gradient is a sum of positive terms (one
    per ID, its pooling weight): never a cancellation residue near zero, so row-wise
    Adagrad's division by ``sqrt(mean(g^2))`` cannot turn rounding into a whole ``lr``
    step. What differs is only the order of fp32 sums in pooling and the update
    (a few ulp), which torch's fp32 defaults (rtol 1.3e-6, about 10 ulp; atol 1e-5) cover."""
    run_gloo_ranks(_run, 2)
