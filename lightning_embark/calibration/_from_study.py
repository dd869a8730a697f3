"""Refitting the cost model's constants from a tuning study's own runs (``--from-study``).

Every measured trial of ``embark-tune`` is a point: the plan, the estimate's breakdown on
its slowest rank (compute, link time inside and across hosts, per-message latency, the DP
all-reduce) and the measured median step. The refit scales each group of constants so
that the estimates match what was measured, by non-negative least squares over the
points:

    measured_ms ~= c + s_compute * compute_ms + s_link * (intra_ms + inter_ms + latency_ms)
                     + s_allreduce * allreduce_ms

``c`` is what the model does not price (the dense layers, the framework's step); the
scales divide the bandwidths and multiply the per-item seconds of their group. A group
no plan exercised (its column all zero) keeps its constants (scale 1). Plans the study
measured are few and alike, so this is a correction of the model's proportions, not a
calibration from scratch: ``embark-calibrate`` without ``--from-study`` measures those.
The points come from :func:`lightning_embark.search.study_points`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan
from lightning_embark.planner import Calibration, CostModel, load_calibration

_COMPUTE_RATES: tuple[str, ...] = (
    *("lookup_bandwidth", "codec_bandwidth", "cast_codec_bandwidth"),
    *("int8_codec_bandwidth", "unique_pool_bandwidth", "dp_dense_bandwidth", "dense_flops"),
)
_COMPUTE_SECONDS: tuple[str, ...] = (
    *("lookup_bag_seconds", "lookup_id_seconds", "update_row_seconds", "route_id_seconds"),
    *("unique_pool_bag_seconds", "unique_pool_id_seconds", "unique_pool_row_seconds"),
    *("piece_seconds", "codec_piece_seconds", "cast_piece_seconds"),
)
_LINK_RATES = ("intra_bandwidth", "inter_bandwidth")
_LINK_SECONDS = ("intra_latency", "inter_latency", "kernel_overhead")


@dataclass(frozen=True, kw_only=True)
class StudyPoint:
    """One measured trial: its plan, the slowest rank's estimate and the measured step."""

    number: int
    plan: dict[str, Any]
    predicted: dict[str, float]
    measured_ms: float


@dataclass(frozen=True, kw_only=True)
class Refit:
    """The refit calibration and how well old and new constants rank the study's plans.

    Attributes:
        calibration: The constants, rescaled.
        scales: ``compute``, ``link`` and ``allreduce`` scale factors.
        intercept_ms: What the model does not price, per step.
        rho_before: Spearman correlation of estimated and measured steps, old constants.
        rho_after: The same with the refit constants.
        points: How many trials the fit used.
        kept: Groups the fit could not scale (no plan exercised them, or the best
            non-negative fit gives them no weight): their constants are unchanged.
    """

    calibration: Calibration
    scales: dict[str, float]
    intercept_ms: float
    rho_before: float
    rho_after: float
    points: int
    kept: tuple[str, ...] = ()


def _scaled(calib: Calibration, names: tuple[str, ...], factor: float, *, rate: bool) -> dict:
    out = {}
    for name in names:
        value = getattr(calib, name)
        if value is not None:
            out[name] = value / factor if rate else value * factor
    return out


def refit(calib: Calibration, points: list[StudyPoint], *, model: CostModel) -> Refit:
    """Rescale ``calib`` so that its estimates of ``points`` match their measurements.

    Args:
        calib: The constants the study planned with.
        points: The study's measured trials (at least 3).
        model: A cost model of the study's workload under ``calib`` (for the
            correlations; its constants are replaced for the "after" one).

    Raises:
        ConfigError: fewer than 3 points.
    """
    from scipy.optimize import nnls

    from lightning_embark.calibration._fit import spearman

    if len(points) < 3:
        raise ConfigError(
            f"the study has {len(points)} measured trials; a refit needs at least 3 (run more "
            "--trials)"
        )
    p = [pt.predicted for pt in points]
    columns = {
        "compute": [x["compute_ms"] for x in p],
        "link": [x["intra_ms"] + x["inter_ms"] + x["latency_ms"] for x in p],
        "allreduce": [x["allreduce_ms"] for x in p],
    }
    used = [k for k, v in columns.items() if any(abs(c) > 0 for c in v)]
    matrix = np.column_stack([np.ones(len(points))] + [np.asarray(columns[k]) for k in used])
    measured = np.asarray([pt.measured_ms for pt in points])
    coef, _ = nnls(matrix, measured)
    scales = dict.fromkeys(columns, 1.0)
    for k, value in zip(used, coef[1:], strict=True):
        scales[k] = float(value) if value > 0 else 1.0
    kept = tuple(k for k in columns if k not in used or coef[1 + used.index(k)] <= 0)
    changes: dict[str, Any] = {}
    changes |= _scaled(calib, _COMPUTE_RATES, scales["compute"], rate=True)
    changes |= _scaled(calib, _COMPUTE_SECONDS, scales["compute"], rate=False)
    changes |= _scaled(calib, _LINK_RATES, scales["link"], rate=True)
    changes |= _scaled(calib, _LINK_SECONDS, scales["link"], rate=False)
    if calib.allreduce_bandwidth is not None:
        changes["allreduce_bandwidth"] = calib.allreduce_bandwidth / scales["allreduce"]
    if calib.allreduce_latency is not None:
        changes["allreduce_latency"] = calib.allreduce_latency * scales["allreduce"]
    changes["name"] = f"{calib.name}-refit"
    changes["source"] = (
        f"{calib.source}; refit from {len(points)} measured embark-tune trials (scales "
        + ", ".join(f"{k} x{v:.3g}" for k, v in scales.items())
        + ")"
    )
    new = dataclasses.replace(calib, **changes)
    after = CostModel(
        model.spec,
        new,
        num_hosts=model.num_hosts,
        ranks_per_host=model.ranks_per_host,
        batch_size=model.batch_size,
    )
    estimates = [after.estimate(Plan.from_dict(pt.plan)).step_time_ms for pt in points]
    return Refit(
        calibration=new,
        scales=scales,
        intercept_ms=float(coef[0]),
        rho_before=spearman([x["total_ms"] for x in p], list(measured)),
        rho_after=spearman(estimates, list(measured)),
        points=len(points),
        kept=kept,
    )


def refit_study(config: dict[str, Any], points: list[StudyPoint]) -> Refit:
    """:func:`refit` of a study's own topology on its measured trials (``config`` is the
    study's stored ``embark-tune`` configuration)."""
    from lightning_embark.spec import load_spec

    calib = load_calibration(config["topology"])
    model = CostModel(
        load_spec(config["model"], max_rows=config.get("max_rows")),
        calib,
        num_hosts=config["num_hosts"],
        ranks_per_host=config["ranks_per_host"],
        batch_size=config["batch_size"],
    )
    return refit(calib, points, model=model)
