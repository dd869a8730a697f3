"""Towers in the plan: what a tower may hold, where its blocks may live, the JSON format,
the host plan the tower's ranks run and a plan cut down to one collection."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Plan,
    TableLayout,
    TowerModule,
    TowerPlan,
    host_plan,
    layouts,
    restrict,
)
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.topology import Topology


def _plan(**tower: object) -> Plan:
    """2 hosts x 2 ranks: flat 'x' on rank 0, tower 'T' on host 1 holding 'y' and 'z'."""
    fields = {"name": "T", "host": 1, "tables": ("y", "z"), **tower}
    return Plan(
        world_size=4,
        ranks_per_host=2,
        clusters=(
            ClusterPlan(name="flat", type=ClusterType.RB),
            ClusterPlan(name="trb", type=ClusterType.RB),
            ClusterPlan(name="tdp", type=ClusterType.DP),
        ),
        tables=(
            layouts.table_wise("x", "flat", 0),
            layouts.row_wise("y", "trb", [2, 3]),
            layouts.host_data_parallel("z", "tdp", 1, 2),
        ),
        towers=(TowerPlan(**fields),),  # type: ignore[arg-type]
    )


def _spec(rows: int = 100) -> ModelSpec:
    return ModelSpec(
        name="m",
        tables=tuple(
            TableSpec(name=n, num_embeddings=rows, embedding_dim=8, pooling_factor=1.0)
            for n in "xyz"
        ),
    )


def test_a_towered_plan_round_trips_through_json_and_validates(tmp_path: Path) -> None:
    plan = _plan(module="projection", output_dim=4, forward_compression="fp16")
    plan.validate(_spec())
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.towers[0].module is TowerModule.PROJECTION
    assert json.loads(path.read_text())["version"] == 2
    assert plan.tower_of("y") == plan.towers[0] and plan.tower_of("x") is None


def test_a_version_1_plan_without_towers_still_loads(tmp_path: Path) -> None:
    data = _plan().to_dict()
    data["version"] = 1
    del data["towers"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    plan = Plan.load(path)
    assert plan.towers == () and plan.version == 2
    data["towers"] = _plan().to_dict()["towers"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="version 1 has no towers"):
        Plan.load(path)


def test_a_dp_table_in_a_tower_is_replicated_on_its_host_only() -> None:
    bad = _plan()
    with pytest.raises(ConfigError, match=r"DP needs \(r=2, k=1, c=1\) \(in tower 'T'"):
        dataclasses.replace(
            bad,
            tables=(*bad.tables[:2], TableLayout(table="z", cluster="tdp", ranks=((2,),))),
        ).validate(_spec())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"host": 2}, r"tower 'T' is on host 2 but the plan has 2 host\(s\)"),
        ({"tables": ("y", "w")}, "names table 'w', which has no layout"),
        ({"tables": ("y", "y")}, "lists a table twice"),
        ({"tables": ()}, "has no tables"),
        ({"module": "projection"}, "a projection tower needs output_dim"),
        ({"output_dim": 4}, "an identity tower returns its pooled vectors"),
        ({"module": "mlp", "output_dim": 4}, r"tower 'T' module is 'mlp'; choose one of"),
        ({"forward_compression": "fp4"}, "forward_compression is 'fp4'"),
        ({"host": True}, "host must be a non-negative integer"),
    ],
)
def test_a_malformed_tower_is_refused_by_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _plan(**change)


def test_a_tower_block_off_its_host_and_a_mixed_cluster_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"has blocks on rank\(s\) \[0\], outside the tower's"):
        _plan(tables=("x", "y", "z"))
    plan = _plan()
    with pytest.raises(
        ConfigError, match=r"cluster 'flat' mixes .* x \(flat\), y \(tower host 1\)"
    ):
        dataclasses.replace(
            plan, tables=(plan.tables[0], layouts.row_wise("y", "flat", [2, 3]), plan.tables[2])
        )
    with pytest.raises(ConfigError, match="table 'y' is in towers 'T' and 'U'"):
        dataclasses.replace(
            plan, towers=(*plan.towers, TowerPlan(name="U", host=1, tables=("y",)))
        )
    with pytest.raises(ConfigError, match="duplicate tower names"):
        dataclasses.replace(
            plan, towers=(plan.towers[0], TowerPlan(name="T", host=1, tables=("z",)))
        )


def test_a_tower_that_does_not_fit_names_the_tower_and_its_host() -> None:
    topology = Topology(
        name="t",
        num_hosts=2,
        ranks_per_host=2,
        memory_per_rank=100_000,  # x (96 kB) fits rank 0; y + z (144 kB) do not fit rank 2
        intra_host_bandwidth=1e11,
        inter_host_bandwidth=1e10,
    )
    with pytest.raises(PlanInfeasibleError, match="of tower 'T', which must fit host 1"):
        _plan().validate(_spec(rows=3000), topology)


def test_the_host_plan_counts_ranks_inside_the_host() -> None:
    sub = host_plan(_plan(), 1)
    assert (sub.world_size, sub.ranks_per_host, sub.towers) == (2, 2, ())
    assert [c.name for c in sub.clusters] == ["trb", "tdp"]
    assert [t.ranks for t in sub.tables] == [((0, 1),), ((0,), (1,))]
    sub.validate(ModelSpec(name="h", tables=_spec().tables[1:]))
    assert host_plan(_plan(), 0).tables == ()


def test_restricting_a_plan_keeps_whole_towers_and_refuses_split_ones() -> None:
    plan = _plan()
    assert restrict(plan, ["x"]).towers == ()
    assert [t.table for t in restrict(plan, ["z", "y"]).tables] == ["z", "y"]
    with pytest.raises(ConfigError, match=r"tower 'T' holds tables \['y'\] of this collection"):
        restrict(plan, ["x", "y"])
