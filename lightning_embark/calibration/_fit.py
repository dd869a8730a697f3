"""Fitting the cost model's constants to measurements (``embark-calibrate``).

Two halves, testable apart:

* **Measurement** (:mod:`~lightning_embark.calibration._probes`, inside a process group,
  every rank calls it): links, all-reduce, hierarchical exchanges, lookups, a UB
  requester's own work, codecs, the engine on a tiny batch.
* **Fitting** (pure, here): per link class, ``t = alpha + bytes / bandwidth`` by least
  squares over the message sizes (slope from the large messages, intercept from the
  small ones: :func:`fit_alpha_beta`); lookups (and a UB requester's work) as ``per bag
  + per ID + bytes / bandwidth + per distinct row`` by non-negative least squares (narrow
  rows on CPUs cost per bag and ID, not per byte); the hierarchical cross-host stage's
  efficiency (:func:`hierarchical_efficiency`); and each fit's quality
  (:func:`warn_poor_fits`).
  :func:`~lightning_embark.calibration._from_measurements.build_calibration` turns the
  measurements into a :class:`~lightning_embark.planner.Calibration` whose ``source``
  says ``measured: ...``.

Per-peer times: an all-to-all in a group of ``n`` ranks moves ``n - 1`` messages of
``m`` bytes per rank, so ``t / (n - 1)`` is fitted against ``m``; alpha is then the
per-peer latency and bandwidth the per-rank bandwidth, as the cost model uses them.

The per-rank worker that ``embark-calibrate`` launches on every host is
:mod:`~lightning_embark.calibration._worker`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_embark.errors import ConfigError

log = logging.getLogger(__name__)

#: A fitted term whose rms relative error over its own measurements exceeds this is
#: reported. Sound runs stay below it (the lookup fit was 7% on one process and 26%
#: with 4 ranks oversubscribing 2 cores, docs/benchmarks.md), so it does not fire on
#: ordinary noise; a fit this far off its points prices some message sizes or shapes
#: at half or twice what they cost, enough to reorder the plans the planner compares.
POOR_FIT_REL_RMS = 0.30


@dataclass(frozen=True)
class LinkFit:
    """``t = latency + bytes / bandwidth`` fitted to measurements.

    Attributes:
        latency: Seconds per message (alpha), >= 0.
        bandwidth: Bytes per second (1 / beta), > 0.
        rel_rms: Root-mean-square relative error of the fit over the points.
    """

    latency: float
    bandwidth: float
    rel_rms: float

    def predict(self, num_bytes: float | np.ndarray) -> float | np.ndarray:
        return self.latency + np.asarray(num_bytes, dtype=float) / self.bandwidth


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> LinkFit:
    """Least-squares ``t = alpha + m / bandwidth`` over ``(m, t)`` points.

    The slope (1 / bandwidth) is the ordinary least-squares slope, which the large
    messages determine: the sustained rate, not a shaper's burst allowance. The
    intercept (alpha) then minimises the *relative* error given that slope, so the
    small messages, where latency dominates, determine it; it is clipped at 0.

    Raises:
        ConfigError: fewer than two distinct sizes, non-positive times, or times that
            do not grow with size (no bandwidth can be fitted).
    """
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if m.shape != t.shape or m.ndim != 1:
        raise ConfigError(
            f"sizes and seconds must be equal-length lists, got {m.shape} and {t.shape}"
        )
    if len(np.unique(m)) < 2:
        raise ConfigError(
            "fitting latency and bandwidth needs at least two distinct sizes, got "
            f"{sorted(set(m))}"
        )
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ConfigError(f"measured times must be positive and finite, got {t.tolist()}")
    dm = m - m.mean()
    beta = float(np.sum(dm * (t - t.mean())) / np.sum(dm**2))
    if not beta > 0:
        raise ConfigError(
            "time does not grow with message size "
            f"({dict(zip(m.tolist(), t.tolist(), strict=False))}); "
            "use larger --sizes so that bandwidth dominates the largest messages"
        )
    w = 1.0 / t**2
    alpha = max(0.0, float(np.sum(w * (t - beta * m)) / np.sum(w)))
    fit = LinkFit(latency=alpha, bandwidth=1.0 / beta, rel_rms=0.0)
    rel = (fit.predict(m) - t) / t
    return LinkFit(
        latency=fit.latency, bandwidth=fit.bandwidth, rel_rms=float(np.sqrt(np.mean(rel**2)))
    )


@dataclass(frozen=True)
class LookupFit:
    """Forward plus backward lookup seconds
    ``= call + bags * bag + ids * id + bytes / bandwidth + unique_rows * unique_row``."""

    call: float
    bag: float
    id: float
    bandwidth: float
    unique_row: float
    rel_rms: float


def fit_lookup(points: Sequence[dict]) -> LookupFit:
    """Non-negative least squares of lookup times over (bags, IDs, bytes, distinct rows)
    points, relative errors (each row divided by its time). Points without
    ``unique_rows`` count every ID as a distinct row.

    Raises:
        ConfigError: fewer than four points, or non-positive times.
    """
    from scipy.optimize import nnls

    if len(points) < 5:
        raise ConfigError(f"fitting the lookup cost needs at least 5 shapes, got {len(points)}")
    t = np.array([p["forward_s"] + p["backward_s"] for p in points])
    if not np.all(t > 0):
        raise ConfigError(f"lookup times must be positive, got {t.tolist()}")
    x = np.array(
        [
            [1.0, p["bags"], p["ids"], p["bytes_read"], p.get("unique_rows", p["ids"])]
            for p in points
        ]
    )
    coef, _ = nnls(x / t[:, None], np.ones_like(t))
    pred = x @ coef
    inv_bw = coef[3] if coef[3] > 0 else 1e-15
    return LookupFit(
        call=float(coef[0]),
        bag=float(coef[1]),
        id=float(coef[2]),
        bandwidth=float(1.0 / inv_bw),
        unique_row=float(coef[4]),
        rel_rms=float(np.sqrt(np.mean(((pred - t) / t) ** 2))),
    )


def hierarchical_efficiency(series: dict, intra: LinkFit, inter: LinkFit) -> float:
    """The inter-host stage's bytes/s in whole hierarchical exchanges, over ``inter``'s.

    From each exchange's time take away the intra-host stage as the intra fit predicts it
    (two calls, counts and rows, of ``hosts`` shares to each of the ``L - 1`` host
    peers); fit the rest against the bytes each rank sends to other hosts.

    Raises:
        ConfigError: the remaining times do not grow with size.
    """
    world, local = series["world"], series["ranks_per_host"]
    hosts = world // local
    sizes = np.asarray(series["sizes"], dtype=float)
    stage1 = 2 * (local - 1) * intra.latency + (local - 1) * hosts * sizes / intra.bandwidth
    rest = np.maximum(np.asarray(series["seconds"]) - stage1, 1e-9)
    fit = fit_alpha_beta((world - local) * sizes, rest)
    return fit.bandwidth / inter.bandwidth


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(x) != len(y) or len(x) < 2:
        raise ConfigError(
            f"spearman needs two equal-length lists of >= 2 values, got {len(x)} and {len(y)}"
        )
    rx, ry = _ranks(np.asarray(x, dtype=float)), _ranks(np.asarray(y, dtype=float))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float(np.sum(rx**2) * np.sum(ry**2)))
    return float(np.sum(rx * ry) / denom) if denom > 0 else 0.0


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):  # ties share their mean rank
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _constants(fit: LinkFit | LookupFit) -> str:
    if isinstance(fit, LinkFit):
        return f"latency {1e6 * fit.latency:.1f} us, bandwidth {fit.bandwidth / 1e6:.1f} MB/s"
    return (
        f"{1e9 * fit.bag:.0f} ns/bag + {1e9 * fit.id:.0f} ns/ID + "
        f"{1e9 * fit.unique_row:.0f} ns/row + {fit.bandwidth / 1e9:.2f} GB/s"
    )


def warn_poor_fits(
    fits: dict[str, Any], *, threshold: float = POOR_FIT_REL_RMS
) -> dict[str, float]:
    """Each fitted term's rms relative error; one warning per term above ``threshold``.

    Returns:
        Term -> rms relative error, for :attr:`Calibration.fit_rel_rms`.
    """
    quality = {
        key: float(fit.rel_rms)
        for key, fit in fits.items()
        if isinstance(fit, (LinkFit, LookupFit))
    }
    for key, error in quality.items():
        if error > threshold:
            log.warning(
                "calibration term %s fits its measurements poorly: rms relative error %.0f%% "
                "(threshold %.0f%%), fitted as %s; the planner will misprice it. Measure again "
                "on an idle machine, with more --repeats or larger --sizes",
                key,
                100 * error,
                100 * threshold,
                _constants(fits[key]),
            )
    return quality
