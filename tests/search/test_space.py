"""The search space builds only valid plans, and its all-``auto`` defaults are the greedy plan."""

from __future__ import annotations

import optuna
import pytest

from lightning_embark.plan import ClusterType, Compression, TowerModule
from lightning_embark.planner import (
    ACCURATE_TOWER_SETTINGS,
    CostModel,
    GreedyConfig,
    GreedyPlanner,
    TowerSetting,
    load_calibration,
)
from lightning_embark.planner._tower_choice import IDENTITY
from lightning_embark.search import AUTO, SearchSpace, plan_key
from lightning_embark.spec import load_spec


def _model(topology: str = "emulated", hosts: int = 2, per_host: int = 2) -> CostModel:
    return CostModel(
        load_spec("demo-small"),
        load_calibration(topology),
        num_hosts=hosts,
        ranks_per_host=per_host,
        batch_size=512,
    )


def _space(model: CostModel, allow: tuple[str, ...] = ("bf16", "fp16", "fp8")) -> SearchSpace:
    return SearchSpace(
        allow=allow, num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host, max_dim=32
    )


@pytest.mark.parametrize("topology", ["emulated", "dgx-h100"])
def test_greedy_params_rebuild_the_greedy_plan(topology: str) -> None:
    """Trial 0's parameters give exactly the plan the greedy planner makes by itself."""
    model = _model(topology)
    space = _space(model)
    plan, _ = space.plan(optuna.trial.FixedTrial(space.greedy_params()), model)
    greedy = GreedyPlanner(GreedyConfig(allow=space.allow)).plan(model).plan
    assert plan_key(plan) == plan_key(greedy)


def test_every_sampled_candidate_is_a_valid_plan() -> None:
    """Random trials over the whole space: each plan validates against the spec and the
    cluster (``space.plan`` validates), overrides only touch exchanged clusters, and every
    choice made is one the space offered."""
    model = _model()
    space = _space(model)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    keys = set()
    for _ in range(40):
        trial = study.ask()
        plan, _ = space.plan(trial, model)
        keys.add(plan_key(plan))
        for cluster in plan.clusters:
            if cluster.type is ClusterType.DP:
                assert cluster.forward_compression is Compression.FP32
                assert not cluster.hierarchical
            else:
                assert cluster.forward_compression in space.allow
        study.tell(trial, 1.0)
    assert len(keys) > 3  # the knobs do change plans


def test_overrides_replace_the_planner_choice_and_auto_keeps_it() -> None:
    model = _model()
    space = _space(model)
    params = space.greedy_params()
    base, _ = space.plan(optuna.trial.FixedTrial(params), model)
    name = next(c.name for c in base.clusters if c.type is not ClusterType.DP)
    changed, _ = space.plan(
        optuna.trial.FixedTrial(
            params | {f"{name}.compression": "fp8", f"{name}.hierarchical": "on"}
        ),
        model,
    )
    cluster = changed.cluster(name)
    assert cluster.forward_compression is Compression.FP8
    assert cluster.backward_compression is Compression.FP8
    assert cluster.hierarchical
    assert params[f"{name}.compression"] == AUTO
    assert changed.tables == base.tables


def test_one_host_offers_no_hierarchical_choice_and_lossless_no_compression_choice() -> None:
    model = _model(hosts=1, per_host=4)
    space = _space(model, allow=())
    study = optuna.create_study()
    trial = study.ask()
    space.plan(trial, model)
    assert not [p for p in trial.params if p.endswith((".hierarchical", ".compression"))]


def test_split_caps_limit_the_layouts() -> None:
    model = _model()
    space = _space(model)
    params = space.greedy_params() | {"max_row_shards": 1, "max_col_shards": 1, "dp": False}
    plan, _ = space.plan(optuna.trial.FixedTrial(params), model)
    assert all(t.num_row_shards == 1 and t.num_col_shards == 1 for t in plan.tables)


def test_towers_are_searched_as_towers_auto_chooses_them_when_asked() -> None:
    """``towers=True``: trial 0 (``towers=0``) is still the greedy plan; sampled trials
    plan 0, H, 2H or L*H towers of an offered module (``tower_module``, asked only when
    more than one is offered: by default identity alone, no compressing setting having
    been shown to keep accuracy); a tower host's clusters get no hierarchical choice (they
    span one host), flat exchanged clusters still do."""
    model = _model()
    space = SearchSpace(allow=("fp16",), num_hosts=2, ranks_per_host=2, max_dim=32, towers=True)
    assert space.tower_counts == (0, 2, 4)
    assert list(space.tower_settings) == [
        "identity",
        *(f"{s.module.value} r{s.output_ratio:g}" for s in ACCURATE_TOWER_SETTINGS),
    ]
    plan, _ = space.plan(optuna.trial.FixedTrial(space.greedy_params()), model)
    greedy = GreedyPlanner(GreedyConfig(allow=space.allow)).plan(model).plan
    assert plan_key(plan) == plan_key(greedy) and not plan.towers
    dot = TowerSetting(module=TowerModule.DOT, output_ratio=4.0)
    offered = SearchSpace(
        allow=("fp16",),
        num_hosts=2,
        ranks_per_host=2,
        max_dim=32,
        towers=True,
        tower_settings=(IDENTITY, dot),
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        plan, _ = offered.plan(trial, model)
        count = trial.params["towers"]
        module = trial.params.get("tower_module", "identity")
        assert ("tower_module" in trial.params) == (count > 0)
        seen.add((count, module))
        assert len(plan.towers) == count
        assert all(t.module.value == module.split()[0] for t in plan.towers)
        in_towers = {t for tower in plan.towers for t in tower.tables}
        host_clusters = {t.cluster for t in plan.tables if t.table in in_towers}
        for name in host_clusters:
            assert f"{name}.hierarchical" not in trial.params
            assert not next(c for c in plan.clusters if c.name == name).hierarchical
        study.tell(trial, 1.0)
    assert seen == {(0, "identity"), *((c, m) for c in (2, 4) for m in ("identity", "dot r4"))}
    flat_only = SearchSpace(allow=(), num_hosts=1, ranks_per_host=4, max_dim=32, towers=True)
    assert flat_only.tower_counts == () and "towers" not in flat_only.greedy_params()
