"""Planning with towers: valid plans by construction, the rail's bytes by hand, and
errors that name the tower and the host (the partitioner: test_partition.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    TowerModule,
    TowerPlan,
    TowerRequest,
    layouts,
    load_towers,
    save_towers,
)
from lightning_embark.planner import (
    CostModel,
    calibration_for_topology,
    choose_towers,
    offered_settings,
    partition_tables,
    plan_with_towers,
    resolve_towers,
)
from lightning_embark.planner._tower_cost import module_flops, module_parameters, rail_terms
from lightning_embark.spec import load_spec
from lightning_embark.topology import topology_preset

BATCH = 1024


def _model(hosts: int = 2, local: int = 4, spec: str = "demo-small") -> CostModel:
    topology = topology_preset("dgx-h100", num_hosts=hosts, ranks_per_host=local)
    return CostModel(
        load_spec(spec),
        calibration_for_topology(topology),
        num_hosts=hosts,
        ranks_per_host=local,
        batch_size=BATCH,
    )


def test_a_towered_plan_is_valid_and_keeps_each_tower_on_its_host() -> None:
    model = _model()
    requests = partition_tables(model, 2, module=TowerModule.PROJECTION, output_ratio=4.0)
    result = plan_with_towers(model, requests)
    plan = result.plan
    plan.validate(model.spec, topology_preset("dgx-h100", num_hosts=2, ranks_per_host=4))
    assert sorted(t.host for t in plan.towers) == [0, 1]
    for tower in plan.towers:
        dims = {t.embedding_dim for t in model.spec.tables if t.name in tower.tables}
        (dim,) = dims  # demo-small's tables share one width: whole d-wide vectors
        assert tower.output_dim == dim * max(1, round(len(tower.tables) / 4))
        for name in tower.tables:
            ranks = {r for g in plan.layout(name).ranks for r in g}
            assert ranks <= set(range(4 * tower.host, 4 * tower.host + 4))
    assert len(result.notes) == 2 and result.estimate.step_time_ms > 0


def test_compressing_towers_send_a_quarter_of_the_identity_towers_output() -> None:
    """Same towers, identity vs projection with ratio 4: the output's fp32 bytes fall by 4,
    the IDs stay, so cross-host bytes fall by ``3/4`` of the output bytes exactly."""
    model = _model()
    identity = partition_tables(model, 2)
    projected = [
        dataclasses.replace(r, module=TowerModule.PROJECTION, output_ratio=4.0) for r in identity
    ]
    a = plan_with_towers(model, identity).plan
    b = plan_with_towers(model, projected).plan
    hot = {t.name: model.loads[model.index[t.name]].hotness for t in model.spec.tables}
    dims = {t.name: t.embedding_dim for t in model.spec.tables}
    rail_a = rail_terms(a, batch_size=BATCH, hotness=hot, dims=dims)
    rail_b = rail_terms(b, batch_size=BATCH, hotness=hot, dims=dims)
    output_a = rail_a.sent.sum() + rail_a.received.sum()
    output_b = rail_b.sent.sum() + rail_b.received.sum()
    ids = sum(
        2 * BATCH * 4 * (1 + hot[n]) * (model.num_hosts - 1) * model.ranks_per_host
        for t in a.towers
        for n in t.tables
    )
    assert output_a - ids == pytest.approx(4 * (output_b - ids), rel=1e-3)


def test_tower_modules_compute_is_six_flops_per_parameter_and_sample_on_their_host() -> None:
    """A projection over ``V = H * B`` samples costs every rank of its host ``6 V P``
    FLOPs (forward ``2 D O``, two gradients ``4 D O`` per sample) at ``dense_flops``;
    the other host's ranks and the bytes are unchanged. Compared with the same plan
    priced without the constant, so only that term differs."""
    model = _model(hosts=2, local=2)
    (request,) = partition_tables(model, 1, module=TowerModule.PROJECTION, output_ratio=4.0)
    plan = plan_with_towers(model, [request]).plan
    unpriced = CostModel(
        model.spec,
        dataclasses.replace(model.calib, dense_flops=None),
        num_hosts=2,
        ranks_per_host=2,
        batch_size=BATCH,
    )
    with_flops, without = model.estimate(plan).per_rank, unpriced.estimate(plan).per_rank
    (tower,) = plan.towers
    width = sum(t.embedding_dim for t in model.spec.tables if t.name in tower.tables)
    params = width * tower.output_dim + tower.output_dim
    seconds = 6 * 2 * BATCH * params / model.calib.dense_flops
    for a, b in zip(with_flops, without, strict=True):
        expected = seconds if a.host == tower.host else 0.0
        assert a.compute_ms - b.compute_ms == pytest.approx(1e3 * expected, rel=1e-9, abs=1e-9)
        assert a.inter_bytes == b.inter_bytes


def test_the_rail_bytes_match_the_arithmetic_on_a_small_plan() -> None:
    """2 hosts x 1 rank, one identity tower of one 8-wide table (hotness 2) on host 1:
    rank 0 sends B (1 + 2) 4 bytes of IDs and a B x 8 fp32 gradient and receives the
    B x 8 output; rank 1 mirrors it."""
    plan = Plan(
        world_size=2,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="c", type=ClusterType.RB),),
        tables=(layouts.table_wise("x", "c", 1),),
        towers=(TowerPlan(name="T", host=1, tables=("x",)),),
    )
    rail = rail_terms(plan, batch_size=10, hotness={"x": 2.0}, dims={"x": 8})
    ids, rows = 10 * 3 * 4, 10 * 8 * 4
    assert rail.sent.tolist() == [ids + rows, rows]
    assert rail.received.tolist() == [rows, ids + rows]
    assert rail.calls == 4
    assert module_parameters(TowerModule.DCN, 8, 2) == 8 * 2 + 2 + 8 * 8 + 8
    # A dot tower of 4 tables of width 4 sending 6 pair terms projects 16 -> 8 - 6.
    assert module_parameters(TowerModule.DOT, 16, 8, 4) == 16 * 2 + 2
    assert module_flops(TowerModule.DOT, 16, 8, 4) == 6 * (16 * 2 + 2) + 6 * 4 * 6


def test_towers_that_do_not_fit_their_host_name_it() -> None:
    model = _model(local=2)
    calib = dataclasses.replace(
        model.calib, memory_per_rank=5e6
    )  # 17 MB of tables, 10 MB on a host
    small = CostModel(model.spec, calib, num_hosts=2, ranks_per_host=2, batch_size=BATCH)
    everything = [
        TowerRequest(name="all", tables=tuple(t.name for t in model.spec.tables), host=1)
    ]
    with pytest.raises(PlanInfeasibleError, match=r"towers \['all'\] do not fit host 1"):
        plan_with_towers(small, everything)


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([TowerRequest(name="a", tables=("nope",))], "names table 'nope', which spec"),
        ([TowerRequest(name="a", tables=("f0",), host=5)], r"asks for host 5, outside 0..1"),
        (
            [TowerRequest(name="a", tables=("f0",)), TowerRequest(name="b", tables=("f0",))],
            "table 'f0' is in towers 'a' and 'b'",
        ),
    ],
)
def test_bad_tower_requests_are_refused(requests: list[TowerRequest], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_with_towers(_model(), requests)


def test_a_tower_request_needs_one_width_for_a_compressing_module() -> None:
    with pytest.raises(ConfigError, match="exactly one of output_dim and output_ratio"):
        TowerRequest(name="a", tables=("f0",), module=TowerModule.DCN)
    with pytest.raises(ConfigError, match="identity tower has no output width"):
        TowerRequest(name="a", tables=("f0",), output_ratio=2.0)
    with pytest.raises(ConfigError, match="must be >= 1"):
        TowerRequest(name="a", tables=("f0",), module="projection", output_ratio=0.5)
    assert (
        TowerRequest(name="a", tables=("f0",), forward_compression=Compression.FP16)
        .resolved([16], 0)
        .forward_compression
        == "fp16"
    )


def test_planner_and_model_agree_on_a_ratio_s_width() -> None:
    """13 tables of width 16 at ratio 4: D_t / 4 = 52 is not a whole number of the
    interaction's 16-wide vectors; both sides take 16 * round(13 / 4) = 48. Mixed widths
    have no such unit: round(D_t / R)."""
    from lightning_embark.models._tower_dlrm import tower_output_dim

    request = TowerRequest(
        name="a", tables=tuple(f"t{i}" for i in range(13)), module="projection", output_ratio=4.0
    )
    assert request.resolved([16] * 13, 0).output_dim == 48
    assert tower_output_dim(request, 13, 16) == 48
    assert request.output_width([16, 32, 8]) == round(56 / 4)
    fixed = TowerRequest(name="b", tables=("t0",), module="dcn", output_dim=24)
    assert fixed.output_width([16]) == 24


def test_a_towers_file_round_trips_and_names_its_mistakes(tmp_path: Path) -> None:
    towers = [
        TowerRequest(name="a", tables=("f0", "f3"), host=1, module="projection", output_ratio=4.0),
        TowerRequest(name="b", tables=("f1",)),
    ]
    path = tmp_path / "towers.json"
    save_towers(towers, path)
    assert load_towers(path) == towers
    assert json.loads(path.read_text())["towers"][1] == {"name": "b", "tables": ["f1"]}
    path.write_text(json.dumps({"towers": [{"name": "a", "tables": ["f0"], "width": 3}]}))
    with pytest.raises(ConfigError, match=r"tower 0 has unknown field\(s\) \['width'\]"):
        load_towers(path)
    path.write_text(json.dumps({"towers": [{"name": "a", "tables": ["f0"], "module": "dcn"}]}))
    with pytest.raises(ConfigError, match=r"tower 0 \('a'\): .*exactly one of output_dim"):
        load_towers(path)
    with pytest.raises(ConfigError, match="cannot read towers file"):
        load_towers(tmp_path / "missing.json")


def test_towers_resolve_from_a_count_auto_a_file_or_requests(tmp_path: Path) -> None:
    model = _model(hosts=2, local=4)
    assert resolve_towers(model, "auto") == (
        choose_towers(model, settings=offered_settings(None, None)).towers or []
    )
    projected = resolve_towers(model, 3, module=TowerModule.DCN, output_ratio=2.0)
    assert projected == partition_tables(model, 3, module=TowerModule.DCN, output_ratio=2.0)
    assert resolve_towers(model, "3") == partition_tables(model, 3)  # a command line's digits
    given = [TowerRequest(name="t", tables=("f1", "f2"), host=1)]
    assert resolve_towers(model, given) == given
    save_towers(given, tmp_path / "towers.json")
    assert resolve_towers(model, tmp_path / "towers.json") == given
    assert resolve_towers(model, str(tmp_path / "towers.json")) == given
    with pytest.raises(ConfigError, match="names each tower's module and width"):
        resolve_towers(model, tmp_path / "towers.json", module=TowerModule.PROJECTION)
    with pytest.raises(ConfigError, match="neither 'auto', a tower count nor an existing"):
        resolve_towers(model, "towers.jsn")
