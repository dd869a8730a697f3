"""Refitting the cost model from a study's points (``embark-calibrate --from-study``).

The points are made from the cost model itself: for a handful of plans the search space
builds, "measured" is a known linear function of the estimate's groups. The refit must
find that function's coefficients, and its calibration must reproduce them rank by rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from lightning_embark.calibration import StudyPoint, refit
from lightning_embark.cli import embark_calibrate as cli_calibrate
from lightning_embark.errors import ConfigError
from lightning_embark.planner import Calibration, CostModel, load_calibration
from lightning_embark.search import SearchSpace, plan_key, study_points
from lightning_embark.search._objective import slowest_rank
from lightning_embark.spec import load_spec

#: The "true" proportions of the synthetic cluster: what the refit must recover.
INTERCEPT_MS, COMPUTE, LINK, ALLREDUCE = 7.0, 2.0, 3.0, 0.5


def _model(calib: Calibration) -> CostModel:
    return CostModel(load_spec("demo-small"), calib, num_hosts=2, ranks_per_host=2, batch_size=256)


def _plans(model: CostModel, count: int = 12) -> list:
    """Distinct feasible plans drawn from the search space (a seeded random sampler)."""
    space = SearchSpace(allow=("fp16", "int8"), num_hosts=2, ranks_per_host=2, max_dim=32)
    plans: dict[str, object] = {}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    for _ in range(60):
        trial = study.ask()
        try:
            plan, _ = space.plan(trial, model)
        except ConfigError:
            continue
        plans.setdefault(plan_key(plan), plan)
        if len(plans) == count:
            break
    return list(plans.values())


def _truth(breakdown: dict[str, float]) -> float:
    link = breakdown["intra_ms"] + breakdown["inter_ms"] + breakdown["latency_ms"]
    return (
        INTERCEPT_MS
        + COMPUTE * breakdown["compute_ms"]
        + LINK * link
        + ALLREDUCE * breakdown["allreduce_ms"]
    )


def _points(model: CostModel, plans: list) -> list[StudyPoint]:
    points = []
    for number, plan in enumerate(plans):
        predicted = slowest_rank(model.estimate(plan))
        points.append(
            StudyPoint(
                number=number,
                plan=plan.to_dict(),
                predicted=predicted,
                measured_ms=_truth(predicted),
            )
        )
    return points


def test_refit_recovers_the_scales_and_the_refit_constants_reproduce_them() -> None:
    """Exact linear data: non-negative least squares recovers the coefficients to the
    solver's precision (double precision, a condition number of the 12 x 4 design well
    under 1e6, so 1e-6 relative); the rescaled constants then multiply each group's time
    on every rank by its scale (rates divided, per-item seconds multiplied: every term is
    one product of them, so only rounding separates the two, 1e-9 relative)."""
    calib = load_calibration("emulated")
    model = _model(calib)
    plans = _plans(model)
    assert len(plans) >= 6, "the space should give several distinct plans"
    points = _points(model, plans)
    result = refit(calib, points, model=model)
    uses_allreduce = any(p.predicted["allreduce_ms"] > 0 for p in points)
    assert result.points == len(points)
    assert result.intercept_ms == pytest.approx(INTERCEPT_MS, rel=1e-6)
    assert result.scales["compute"] == pytest.approx(COMPUTE, rel=1e-6)
    assert result.scales["link"] == pytest.approx(LINK, rel=1e-6)
    assert result.scales["allreduce"] == pytest.approx(ALLREDUCE if uses_allreduce else 1.0)
    assert result.rho_after >= result.rho_before
    assert result.kept == (() if uses_allreduce else ("allreduce",))
    assert result.calibration.name == "emulated-refit"
    after = _model(result.calibration)
    for plan in plans:
        for old, new in zip(
            model.estimate(plan).per_rank, after.estimate(plan).per_rank, strict=True
        ):
            assert new.compute_ms == pytest.approx(
                result.scales["compute"] * old.compute_ms, rel=1e-9
            )
            assert new.inter_ms == pytest.approx(result.scales["link"] * old.inter_ms, rel=1e-9)
            assert new.latency_ms == pytest.approx(
                result.scales["link"] * old.latency_ms, rel=1e-9
            )


def test_refit_needs_three_points() -> None:
    calib = load_calibration("emulated")
    model = _model(calib)
    points = _points(model, _plans(model, count=2))
    with pytest.raises(ConfigError, match="at least 3"):
        refit(calib, points, model=model)


def _stored_study(storage: str, model: CostModel, plans: list) -> None:
    """A study shaped like embark-tune's: its configuration and measured trials, plus a
    cached trial that must not count twice."""
    config = {
        "topology": "emulated",
        "model": "demo-small",
        "max_rows": None,
        "num_hosts": 2,
        "ranks_per_host": 2,
        "batch_size": 256,
    }
    study = optuna.create_study(study_name="embark-tune", storage=storage)
    study.set_user_attr("config", config)
    for point in _points(model, plans):
        trial = study.ask()
        for key, value in (
            ("plan", point.plan),
            ("predicted", point.predicted),
            ("measured_ms", point.measured_ms),
        ):
            trial.set_user_attr(key, value)
        study.tell(trial, point.measured_ms)
    cached = study.ask()
    cached.set_user_attr("cached_from", 0)
    cached.set_user_attr("measured_ms", 1.0)
    study.tell(cached, 1.0)


def test_from_study_reads_the_points_and_writes_a_calibration_embark_plan_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model(load_calibration("emulated"))
    plans = _plans(model, count=8)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    _stored_study(storage, model, plans)
    config, points = study_points(storage, "embark-tune")
    assert config["topology"] == "emulated" and len(points) == len(plans)

    out = tmp_path / "refit.json"
    assert cli_calibrate.main(["--from-study", storage, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"from {len(plans)} measured trials" in printed and "rank correlation" in printed
    saved = Calibration.load(out)
    assert saved.name == "emulated-refit"
    assert "refit from" in json.loads(out.read_text())["source"]


def test_from_study_names_a_missing_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(study_name="other", storage=storage)
    out = tmp_path / "refit.json"
    code = cli_calibrate.main(["--from-study", storage, "--study-name", "nope", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "other" in err and "--study-name" in err
    assert not out.exists()
