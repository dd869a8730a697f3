"""Intervals for paired ratios that hold on a few noisy repeats.

A benchmark pair (two strategies run back to back, repeat after repeat) gives one ratio
per repeat. On a shared machine a configuration's step moves by tens of percent between
repeats, so a claim needs an interval, and one that does not assume normal noise: the
Wilcoxon signed-rank interval of the log ratios (distribution-free for differences
symmetric about their centre; exact for any number of repeats).

Its estimate is the Hodges-Lehmann one, the median of the Walsh averages
``(x_i + x_j) / 2, i <= j``; the interval runs from the ``d``-th smallest to the ``d``-th
largest Walsh average, with ``d`` the largest count such that
``P(T <= d - 1) <= (1 - confidence) / 2`` for the signed-rank statistic ``T`` of ``n``
values (:func:`signed_rank_counts`). With few values the interval cannot reach every
level: 5 values reach at most 93.75%, so a 95% interval needs 6 repeats, and the
achieved level is always reported.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_embark.errors import ConfigError


def signed_rank_counts(n: int) -> list[int]:
    """How many of the ``2**n`` sign patterns give each signed-rank sum ``0 .. n(n+1)/2``:
    the exact null distribution of Wilcoxon's ``T`` (each rank in or out of the sum)."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return counts


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A paired estimate with its interval.

    Attributes:
        estimate: The Hodges-Lehmann estimate.
        low: Lower bound.
        high: Upper bound.
        confidence: The level the interval achieves (at least the one asked, when the
            number of values allows it; else the widest interval's, below it).
        n: Values it rests on.
    """

    estimate: float
    low: float
    high: float
    confidence: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "n": self.n,
        }


def wilcoxon_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The Hodges-Lehmann estimate of ``values``' centre and its Wilcoxon interval.

    Raises:
        ConfigError: no values, or a confidence outside ``(0, 1)``.
    """
    if not values:
        raise ConfigError("an interval needs at least one value")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence!r}")
    n = len(values)
    walsh = sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))
    cumulative = list(itertools.accumulate(signed_rank_counts(n)))
    total = 2**n
    # The interval from the d-th smallest to the d-th largest Walsh average covers with
    # probability 1 - 2 P(T <= d - 1); take the deepest d that still covers enough.
    depth = 1
    while depth < (len(walsh) + 1) // 2 and 1 - 2 * cumulative[depth] / total >= confidence:
        depth += 1
    return Interval(
        estimate=statistics.median(walsh),
        low=walsh[depth - 1],
        high=walsh[len(walsh) - depth],
        confidence=1 - 2 * cumulative[depth - 1] / total,
        n=n,
    )


def ratio_interval(ratios: Sequence[float], confidence: float = 0.95) -> Interval:
    """:func:`wilcoxon_interval` of the log ratios, back as ratios (a ratio's noise is
    multiplicative: ``0.8`` and ``1.25`` are the same distance from 1).

    Raises:
        ConfigError: a ratio that is not positive.
    """
    bad = [r for r in ratios if not r > 0]
    if bad:
        raise ConfigError(f"ratios must be positive, got {bad}")
    logs = wilcoxon_interval([math.log(r) for r in ratios], confidence)
    return Interval(
        estimate=math.exp(logs.estimate),
        low=math.exp(logs.low),
        high=math.exp(logs.high),
        confidence=logs.confidence,
        n=logs.n,
    )


def format_interval(interval: Interval, digits: int = 2) -> str:
    """``0.83 [0.78, 0.90]`` (the achieved level added when it is not the usual 95%)."""
    text = (
        f"{interval.estimate:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"
    )
    if abs(interval.confidence - 0.95) > 0.02:
        text += f" ({interval.confidence:.0%})"
    return text
