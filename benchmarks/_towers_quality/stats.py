"""Paired intervals over seeds: is a variant's AUC within the bar of flat's?

Each seed trains flat and the variant alike (same batches, same table start), so the
per-seed difference ``d_s = AUC_variant,s - AUC_flat,s`` is the unit of evidence. Over
``n`` seeds the mean difference has the two-sided ``1 - alpha`` paired-t interval

    mean(d) +- t_{1 - alpha / 2, n - 1} * sd(d) / sqrt(n),

``sd`` the sample standard deviation (``n - 1`` in its denominator). The t interval
assumes the ``d_s`` roughly normal; with ten seeds it is the standard choice, and the
per-seed values are in the JSON for any other test.

The bar: a variant keeps accuracy when its mean difference is at least ``-MEAN_BAR`` and
its interval's lower bound at least ``-LOWER_BAR``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scipy.stats import t as student_t

MEAN_BAR = 0.001
LOWER_BAR = 0.002
CONFIDENCE = 0.95


@dataclass(frozen=True, kw_only=True)
class Interval:
    """The paired-t interval of per-seed differences (see the module docstring)."""

    mean: float
    low: float
    high: float
    sd: float
    n: int

    @property
    def keeps_accuracy(self) -> bool:
        """Within the bar: mean at least ``-MEAN_BAR``, lower bound at least ``-LOWER_BAR``."""
        return self.mean >= -MEAN_BAR and self.low >= -LOWER_BAR

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"keeps_accuracy": self.keeps_accuracy}


def paired_interval(
    values: Sequence[float], baseline: Sequence[float], *, confidence: float = CONFIDENCE
) -> Interval:
    """The paired-t interval of ``values - baseline`` seed by seed.

    Raises:
        ValueError: the two differ in length, or there are fewer than two seeds.
    """
    if len(values) != len(baseline):
        raise ValueError(f"{len(values)} values paired with {len(baseline)} baselines")
    if len(values) < 2:
        raise ValueError("a paired interval needs at least two seeds")
    deltas = [v - b for v, b in zip(values, baseline, strict=True)]
    n = len(deltas)
    mean, sd = statistics.mean(deltas), statistics.stdev(deltas)
    half = float(student_t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean=mean, low=mean - half, high=mean + half, sd=sd, n=n)
