"""The plan's types: field validation, row-shard arithmetic, JSON round trip, Plan.validate.

Memory checks are hand-computed in bytes (exact integers), so the shortfall a
:class:`PlanInfeasibleError` reports is compared with ``==``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import (
    PLAN_VERSION,
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TableLayout,
)
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.topology import Topology


def _spec(*tables: tuple[str, int, int]) -> ModelSpec:
    """A spec of ``(name, rows, dim)`` tables."""
    return ModelSpec(
        name="m",
        tables=tuple(
            TableSpec(name=n, num_embeddings=rows, embedding_dim=dim, pooling_factor=1.0)
            for n, rows, dim in tables
        ),
    )


def _topology(hosts: int, local: int, memory: int | None = None) -> Topology:
    return Topology(
        num_hosts=hosts,
        ranks_per_host=local,
        memory_per_rank=memory,
        intra_host_bandwidth=1e9,
        inter_host_bandwidth=1e8,
    )


def _plan(world: int, local: int, *tables: TableLayout, dp: bool = False) -> Plan:
    clusters = [ClusterPlan(name="c", type="rb")]
    if dp:
        clusters.append(ClusterPlan(name="dp", type="dp"))
    return Plan(world_size=world, ranks_per_host=local, clusters=tuple(clusters), tables=tables)


# ----------------------------------------------------------------- ClusterPlan


def test_cluster_enums_accept_strings_and_bad_values_name_the_choices() -> None:
    cluster = ClusterPlan(
        name="c", type="ub", forward_compression="fp8", backward_compression="bf16"
    )
    assert cluster.type is ClusterType.UB
    assert (cluster.forward_compression, cluster.backward_compression) == (
        Compression.FP8,
        Compression.BF16,
    )
    with pytest.raises(
        ConfigError, match=r"cluster 'c' type is 'xx'; choose one of \['dp', 'rb', 'ub'\]"
    ):
        ClusterPlan(name="c", type="xx")
    with pytest.raises(
        ConfigError,
        match=r"cluster 'c' backward_compression is 'fp4'; "
        r"choose one of \['fp32', 'bf16', 'fp16', 'fp8', 'int8'\]",
    ):
        ClusterPlan(name="c", type="rb", backward_compression="fp4")


def test_only_fp32_is_lossless() -> None:
    assert [c for c in Compression if c.lossless] == [Compression.FP32]


@pytest.mark.parametrize(
    "fields", [{"forward_compression": "fp16"}, {"hierarchical": True}], ids=["fp16", "hier"]
)
def test_dp_clusters_refuse_a_forward_exchange_setting(fields: dict) -> None:
    with pytest.raises(ConfigError, match="cluster 'd': DP clusters have no forward exchange"):
        ClusterPlan(name="d", type="dp", **fields)
    ClusterPlan(name="r", type="rb", **fields)  # the same settings are fine outside DP


# ----------------------------------------------------------------- TableLayout


def test_layout_counts_are_checked_against_replicas_and_blocks() -> None:
    with pytest.raises(ConfigError, match="table 't': num_col_shards must be >= 1, got 0"):
        TableLayout(table="t", cluster="c", num_col_shards=0, ranks=((),))
    with pytest.raises(ConfigError, match="2 rank groups given for 1 replicas"):
        TableLayout(table="t", cluster="c", ranks=((0,), (1,)))
    with pytest.raises(ConfigError, match=r"replica 1 places 3 blocks but k\*c = 2\*2 = 4"):
        TableLayout(
            table="t",
            cluster="c",
            num_replicas=2,
            num_row_shards=2,
            num_col_shards=2,
            ranks=((0, 1, 2, 3), (0, 1, 2)),
        )
    with pytest.raises(
        ConfigError, match=r"table 't' row_split is 'mod'; choose one of \['hash', 'range'\]"
    ):
        TableLayout(table="t", cluster="c", row_split="mod", ranks=((0,),))
    layout = TableLayout(
        table="t", cluster="c", num_row_shards=2, row_split="range", ranks=[[0, 1]]
    )
    assert layout.row_split is RowSplit.RANGE and layout.ranks == ((0, 1),)


@pytest.mark.parametrize(
    ("rows", "k", "ranges"),
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),  # 10 = 3*3 + 1: the first shard takes the extra row
        (11, 4, [(0, 3), (3, 6), (6, 9), (9, 11)]),
        (12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)]),
        (2, 3, [(0, 1), (1, 2), (2, 2)]),  # fewer rows than shards: the last is empty
    ],
)
def test_range_shards_are_balanced_contiguous_earlier_ones_larger(
    rows: int, k: int, ranges: list[tuple[int, int]]
) -> None:
    layout = layouts.row_wise("t", "c", range(k), RowSplit.RANGE)
    assert [layout.row_range(i, rows) for i in range(k)] == ranges
    assert [layout.shard_rows(i, rows) for i in range(k)] == [b - a for a, b in ranges]


@pytest.mark.parametrize("rows", [1, 7, 10, 11, 12, 13])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_hash_shard_rows_count_the_ids_with_that_residue(rows: int, k: int) -> None:
    hashed = layouts.row_wise("t", "c", range(k))
    for i in range(k):
        assert hashed.shard_rows(i, rows) == sum(1 for r in range(rows) if r % k == i)
    assert sum(hashed.shard_rows(i, rows) for i in range(k)) == rows


@pytest.mark.parametrize(
    ("replicas", "world", "groups"),
    [(1, 4, [0, 0, 0, 0]), (2, 4, [0, 0, 1, 1]), (3, 4, [0, 0, 1, 2]), (4, 4, [0, 1, 2, 3])],
)
def test_replica_groups_split_the_world_into_contiguous_blocks(
    replicas: int, world: int, groups: list[int]
) -> None:
    layout = layouts.replicated("t", "c", [[g] for g in range(replicas)])
    assert [layout.replica_of(q, world) for q in range(world)] == groups


# ----------------------------------------------------------------- Plan: fields and JSON


def test_plan_fields_are_checked() -> None:
    rb = ClusterPlan(name="c", type="rb")
    with pytest.raises(ConfigError, match="plan version 3 is not supported"):
        Plan(world_size=1, ranks_per_host=1, clusters=(), tables=(), version=3)
    with pytest.raises(ConfigError, match="world_size 3 must be a positive multiple"):
        Plan(world_size=3, ranks_per_host=2, clusters=(), tables=())
    with pytest.raises(ConfigError, match="duplicate cluster names"):
        Plan(world_size=1, ranks_per_host=1, clusters=(rb, rb), tables=())
    twice = (layouts.table_wise("t", "c", 0), layouts.table_wise("t", "c", 0))
    with pytest.raises(ConfigError, match="a table has more than one layout"):
        Plan(world_size=1, ranks_per_host=1, clusters=(rb,), tables=twice)
    plan = _plan(4, 2, layouts.table_wise("t", "c", 3))
    assert plan.num_hosts == 2
    with pytest.raises(ConfigError, match=r"plan has no cluster 'x'; clusters: \['c'\]"):
        plan.cluster("x")
    with pytest.raises(ConfigError, match=r"table 'u' is missing .* \(planned tables: \['t'\]\)"):
        plan.layout("u")


def _rich_plan() -> Plan:
    return Plan(
        world_size=4,
        ranks_per_host=2,
        clusters=(
            ClusterPlan(
                name="rb",
                type="rb",
                forward_compression="fp8",
                backward_compression="bf16",
                hierarchical=True,
            ),
            ClusterPlan(name="dp", type="dp"),
        ),
        tables=(
            layouts.grid("g", "rb", [[0, 1], [2, 3]], RowSplit.RANGE),
            layouts.replicated("r", "rb", [[0, 1], [2, 3]], num_col_shards=2),
            layouts.data_parallel("d", "dp", 4),
        ),
    )


def test_to_dict_is_plain_json_and_round_trips(tmp_path: Path) -> None:
    plan = _rich_plan()
    data = plan.to_dict()
    assert json.loads(json.dumps(data)) == data  # only JSON types
    assert data["version"] == PLAN_VERSION
    assert data["clusters"][0] == {
        "name": "rb",
        "type": "rb",
        "forward_compression": "fp8",
        "backward_compression": "bf16",
        "hierarchical": True,
    }
    assert data["tables"][0]["row_split"] == "range"
    assert data["tables"][0]["ranks"] == [[0, 1, 2, 3]]
    assert Plan.from_dict(data) == plan
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    # embark-plan writes {"plan": ..., "estimate": ...}: load reads the plan inside
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"plan": data, "estimate": {"step_time_ms": 1.0}}))
    assert Plan.load(wrapped) == plan


def test_a_missing_version_reads_as_the_current_one() -> None:
    data = _rich_plan().to_dict()
    del data["version"]
    assert Plan.from_dict(data) == _rich_plan()


def test_malformed_plans_raise_config_errors(tmp_path: Path) -> None:
    data = _rich_plan().to_dict()
    with pytest.raises(ConfigError, match="malformed plan JSON: 'world_size'"):
        Plan.from_dict({k: v for k, v in data.items() if k != "world_size"})
    unknown = dict(data, clusters=[data["clusters"][0] | {"speed": 3}])
    with pytest.raises(ConfigError, match=r"malformed plan JSON: .*speed"):
        Plan.from_dict(unknown)
    no_ranks = dict(data, tables=[{"table": "g", "cluster": "rb"}])
    with pytest.raises(ConfigError, match=r"malformed plan JSON: .*ranks"):
        Plan.from_dict(no_ranks)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"cannot read plan .*bad\.json"):
        Plan.load(bad)
    with pytest.raises(ConfigError, match=r"cannot read plan .*absent\.json"):
        Plan.load(tmp_path / "absent.json")


# ----------------------------------------------------------------- Plan.validate: layouts


def test_validate_accepts_a_plan_that_covers_the_spec() -> None:
    spec = _spec(("g", 10, 8), ("r", 9, 8), ("d", 5, 4))
    _rich_plan().validate(spec, _topology(2, 2, memory=10**6))


def test_validate_checks_the_topology_shape() -> None:
    plan = _plan(4, 2, layouts.table_wise("t", "c", 0))
    spec = _spec(("t", 4, 4))
    with pytest.raises(
        ConfigError, match=r"plan is for 4 ranks but the topology has 2 \(1 hosts x 2\)"
    ):
        plan.validate(spec, _topology(1, 2))
    with pytest.raises(ConfigError, match="plan assumes 2 ranks per host but the topology has 4"):
        plan.validate(spec, _topology(1, 4))


def test_validate_rejects_tables_outside_the_spec_and_missing_ones() -> None:
    plan = _plan(2, 2, layouts.table_wise("t", "c", 0), layouts.table_wise("ghost", "c", 1))
    with pytest.raises(ConfigError, match=r"plan lays out tables not in spec 'm': \['ghost'\]"):
        plan.validate(_spec(("t", 4, 4)))
    with pytest.raises(ConfigError, match="table 'u' is missing from the plan"):
        _plan(2, 2, layouts.table_wise("t", "c", 0)).validate(_spec(("t", 4, 4), ("u", 4, 4)))


def test_validate_rejects_a_layout_in_an_unknown_cluster() -> None:
    plan = _plan(1, 1, layouts.table_wise("t", "nope", 0))
    with pytest.raises(ConfigError, match="plan has no cluster 'nope'"):
        plan.validate(_spec(("t", 4, 4)))


@pytest.mark.parametrize(
    ("layout", "rows", "dim", "message"),
    [
        (
            layouts.column_wise("t", "c", [0, 1, 0, 1]),
            8,
            6,
            "table 't': 4 column shards do not divide embedding_dim 6",
        ),
        (
            layouts.row_wise("t", "c", [0, 1, 0]),
            2,
            4,
            "table 't': 3 row shards for only 2 rows",
        ),
        (
            layouts.table_wise("t", "c", 2),
            4,
            4,
            "table 't': replica 0 block 0 is on rank 2, outside a world of 2",
        ),
        (
            layouts.replicated("t", "c", [[0], [1], [0]]),
            4,
            4,
            "table 't': 3 replicas for 2 ranks",
        ),
    ],
    ids=["columns", "rows", "rank", "replicas"],
)
def test_validate_names_the_table_and_what_is_wrong(
    layout: TableLayout, rows: int, dim: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _plan(2, 2, layout).validate(_spec(("t", rows, dim)))


def test_validate_rejects_negative_ranks() -> None:
    with pytest.raises(ConfigError, match="block 1 is on rank -1, outside a world of 2"):
        _plan(2, 2, layouts.row_wise("t", "c", [0, -1])).validate(_spec(("t", 4, 4)))


@pytest.mark.parametrize(
    "layout",
    [
        layouts.table_wise("t", "dp", 0),  # r = 1
        layouts.replicated("t", "dp", [[0, 1], [1, 0]], num_row_shards=2),  # k = 2
        layouts.replicated("t", "dp", [[0, 1], [1, 0]], num_col_shards=2),  # c = 2
    ],
    ids=["one-replica", "row-split", "column-split"],
)
def test_validate_requires_dp_tables_to_be_whole_on_every_rank(layout: TableLayout) -> None:
    plan = _plan(2, 2, layout, dp=True)
    with pytest.raises(ConfigError, match=r"in DP cluster 'dp' .* DP needs \(r=2, k=1, c=1\)"):
        plan.validate(_spec(("t", 4, 4)))
    _plan(2, 2, layouts.data_parallel("t", "dp", 2), dp=True).validate(_spec(("t", 4, 4)))


# ----------------------------------------------------------------- Plan.validate: memory


def _memory_plan() -> tuple[Plan, ModelSpec]:
    """``big`` (11 x 8) hash-split over ranks 0, 1 (6 and 5 rows), ``small`` (4 x 4) on rank 1.

    At 4 bytes per element rank 0 holds 6*8*4 = 192 bytes, rank 1 holds 5*8*4 + 4*4*4 =
    160 + 64 = 224 bytes; rank 1's largest block is big's (160 > 64), although small's
    was placed last.
    """
    plan = _plan(2, 2, layouts.row_wise("big", "c", [0, 1]), layouts.table_wise("small", "c", 1))
    return plan, _spec(("big", 11, 8), ("small", 4, 4))


def test_a_rank_over_its_memory_names_its_largest_table_and_the_exact_shortfall() -> None:
    plan, spec = _memory_plan()
    plan.validate(spec, _topology(1, 2, memory=224))  # exactly enough
    with pytest.raises(PlanInfeasibleError, match="rank 1 needs") as caught:
        plan.validate(spec, _topology(1, 2, memory=200))
    assert caught.value.table == "big"
    assert caught.value.shortfall_bytes == 224 - 200
    assert "split or spread its tables" in str(caught.value)


def test_memory_scales_with_bytes_per_element_and_counts_every_replica() -> None:
    plan, spec = _memory_plan()
    # 8 bytes per element: rank 0 needs 384 and is the first rank over 300.
    with pytest.raises(PlanInfeasibleError, match="rank 0 needs") as caught:
        plan.validate(spec, _topology(1, 2, memory=300), bytes_per_row_element=8.0)
    assert (caught.value.table, caught.value.shortfall_bytes) == ("big", 384 - 300)
    # Two replicas of a 10 x 4 table, column-split in two, all on rank 0: 2 * 2 * 10*2*4 = 320.
    replicated = _plan(2, 2, layouts.replicated("rep", "c", [[0, 0], [0, 0]], num_col_shards=2))
    spec = _spec(("rep", 10, 4))
    replicated.validate(spec, _topology(1, 2, memory=320))
    with pytest.raises(PlanInfeasibleError) as caught:
        replicated.validate(spec, _topology(1, 2, memory=319))
    assert (caught.value.table, caught.value.shortfall_bytes) == ("rep", 1)


def test_no_memory_limit_means_no_memory_check() -> None:
    plan, spec = _memory_plan()
    plan.validate(spec, _topology(1, 2, memory=None))
    plan.validate(spec)


def test_malformed_plan_documents_are_config_errors(tmp_path) -> None:
    """Not an object, or ranks that are not integers: a ConfigError naming what is wrong
    (a bare AttributeError or ValueError before)."""
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list\.json.*expected an object .* got a list"):
        Plan.load(tmp_path / "list.json")
    data = {
        "world_size": 1,
        "ranks_per_host": 1,
        "clusters": [{"name": "c", "type": "rb"}],
        "tables": [{"table": "a", "cluster": "c", "ranks": [["x"]]}],
    }
    with pytest.raises(ConfigError, match="table 'a': rank 'x' is not an integer"):
        Plan.from_dict(data)
    data["tables"][0]["ranks"] = [[True]]
    with pytest.raises(ConfigError, match="rank True is not an integer"):
        Plan.from_dict(data)


def test_a_dp_cluster_refuses_a_backward_compression_it_would_ignore() -> None:
    with pytest.raises(ConfigError, match="backward_compression='fp32'"):
        ClusterPlan(name="d", type="dp", backward_compression="bf16")
