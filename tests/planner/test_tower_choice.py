"""The planner's tower decision (``towers="auto"``): never towers priced above flat, the
cheapest candidate otherwise, compressing settings only where offered, the comparison
kept in the plan."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import Plan, TowerChoice, TowerModule
from lightning_embark.planner import (
    ACCURATE_TOWER_SETTINGS,
    CostModel,
    GreedyPlanner,
    TowerSetting,
    choose_towers,
    load_calibration,
    offered_settings,
    resolve_towers,
    tower_counts,
)
from lightning_embark.spec import load_spec

DOT4 = TowerSetting(module=TowerModule.DOT, output_ratio=4.0)


def _model(spec: str, hosts: int, local: int, batch: int, rows: int | None = None, **calib):
    calibration = dataclasses.replace(load_calibration("emulated"), **calib)
    return CostModel(
        load_spec(spec, max_rows=rows),
        calibration,
        num_hosts=hosts,
        ranks_per_host=local,
        batch_size=batch,
    )


CASES = [
    ("demo-small", 2, 2, 1024, None, {}),
    ("demo-small", 2, 1, 32, 2000, {}),
    ("mlperf-dlrm-dcnv2", 2, 2, 1024, 100_000, {}),
    ("mlperf-dlrm-dcnv2", 4, 2, 512, 100_000, {}),
]


@pytest.mark.parametrize(("spec", "hosts", "local", "batch", "rows", "calib"), CASES)
def test_the_choice_is_the_cheapest_candidate_and_towers_only_below_flat(
    spec: str, hosts: int, local: int, batch: int, rows: int | None, calib: dict
) -> None:
    """Every priced candidate is a plan re-estimated here to the same figure; the chosen one
    is the cheapest of them (flat on a tie), so towers are chosen only when strictly
    cheaper than flat. Both outcomes occur among the cases (demo-small: towers; MLPerf at
    batch 1024 on 2 x 2, where the tower modules' compute outweighs the link: flat)."""
    model = _model(spec, hosts, local, batch, rows, **calib)
    settings = (*offered_settings(None, None), DOT4)
    decision = choose_towers(model, settings=settings)
    choice = decision.choice
    priced = [c for c in choice.candidates if c.step_ms is not None]
    flat = choice.flat_ms
    assert flat is not None and priced[0].label == "flat"
    cheapest = min(priced, key=lambda c: (c.step_ms, c.towers))
    assert choice.chosen == cheapest.label
    estimate = decision.result.estimate.step_time_ms
    assert estimate == pytest.approx(cheapest.step_ms, rel=1e-12)
    if decision.towers is None:
        assert not decision.result.plan.towers and all(c.step_ms >= flat for c in priced)
    else:
        assert estimate < flat
        assert len(decision.result.plan.towers) == cheapest.towers == len(decision.towers)
        assert {t.module for t in decision.result.plan.towers} == {cheapest.module}
    assert decision.result.plan.tower_choice == choice
    assert {c.towers for c in choice.candidates} == {0, *tower_counts(hosts, local, 99)}


def test_both_outcomes_occur_and_the_reason_says_which() -> None:
    towers = choose_towers(_model("demo-small", 2, 2, 1024)).choice
    flat = choose_towers(_model("mlperf-dlrm-dcnv2", 2, 2, 1024, 100_000)).choice
    assert towers.chosen != "flat" and "x flat's" in towers.reason
    assert flat.chosen == "flat" and "at or above flat's" in flat.reason


def test_one_host_stays_flat() -> None:
    decision = choose_towers(
        _model("demo-small", 1, 4, 1024), settings=offered_settings(None, None)
    )
    assert decision.towers is None and decision.choice.chosen == "flat"
    assert decision.choice.reason.startswith("one host")
    assert tower_counts(1, 4, 8) == ()
    assert tower_counts(2, 8, 10) == (2, 4)  # 16 towers would leave some without a table


def test_compressing_settings_are_offered_only_where_shown_to_keep_accuracy() -> None:
    """With no module named, identity and :data:`ACCURATE_TOWER_SETTINGS` (none yet: no
    compressing setting kept accuracy on both datasets) are offered; a named module is
    offered alone (the user's explicit choice)."""
    assert offered_settings(None, None) == (
        TowerSetting(module=TowerModule.IDENTITY),
        *ACCURATE_TOWER_SETTINGS,
    )
    choice = choose_towers(
        _model("demo-small", 2, 2, 1024), settings=offered_settings(None, None)
    ).choice
    modules = {c.module for c in choice.candidates if c.towers}
    assert modules == {TowerModule.IDENTITY, *(s.module for s in ACCURATE_TOWER_SETTINGS)}
    assert offered_settings(TowerModule.PROJECTION, 4.0) == (
        TowerSetting(module=TowerModule.PROJECTION, output_ratio=4.0),
    )
    with pytest.raises(ConfigError, match="identity towers take no ratio"):
        TowerSetting(module=TowerModule.IDENTITY, output_ratio=2.0)
    with pytest.raises(ConfigError, match="need one"):
        TowerSetting(module=TowerModule.DOT)


def test_a_candidate_that_does_not_fit_is_recorded_not_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A candidate whose towers do not fit their hosts (planning them raises the planner's
    infeasibility) is listed with the reason, unpriced, and the choice is among the rest."""
    from lightning_embark.planner import _tower_choice

    real = _tower_choice.plan_with_towers

    def tight(model, requests, planner=None):  # two towers do not fit, more do
        if len(requests) == 2:
            raise PlanInfeasibleError("towers do not fit host 0", table="f0", shortfall_bytes=1.0)
        return real(model, requests, planner)

    monkeypatch.setattr(_tower_choice, "plan_with_towers", tight)
    choice = choose_towers(_model("demo-small", 2, 2, 1024)).choice
    (misfit,) = [c for c in choice.candidates if c.towers == 2]
    assert misfit.step_ms is None and misfit.note == "does not fit: towers do not fit host 0"
    assert choice.chosen != misfit.label


def test_the_choice_travels_with_the_plan_and_is_printed() -> None:
    decision = choose_towers(
        _model("demo-small", 2, 2, 1024), settings=offered_settings(None, None)
    )
    plan = decision.result.plan
    loaded = Plan.from_dict(plan.to_dict())
    assert loaded.tower_choice == decision.choice and loaded == plan
    table = decision.choice.table()
    assert "<- chosen" in table and f"towers: {decision.choice.chosen}" in table
    flat = GreedyPlanner().plan(_model("demo-small", 2, 2, 1024)).plan
    assert "tower_choice" not in flat.to_dict()  # plans without one keep their JSON
    with pytest.raises(ConfigError, match="malformed tower_choice"):
        TowerChoice.from_dict({"chosen": "x"})
    with pytest.raises(ConfigError, match="not among its candidates"):
        TowerChoice(chosen="x", reason="", candidates=())


def test_resolve_auto_is_the_decision() -> None:
    model = _model("mlperf-dlrm-dcnv2", 2, 2, 1024, 100_000)
    assert resolve_towers(model, "auto") == []  # flat is cheaper
    model = _model("demo-small", 2, 2, 1024)
    decided = resolve_towers(model, "auto", module=TowerModule.PROJECTION, output_ratio=4.0)
    assert decided and {t.module for t in decided} == {TowerModule.PROJECTION}
