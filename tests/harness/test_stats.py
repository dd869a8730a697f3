"""The Wilcoxon signed-rank interval of paired ratios, against brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.harness._stats import (
    format_interval,
    ratio_interval,
    signed_rank_counts,
    wilcoxon_interval,
)


def test_signed_rank_counts_are_the_sign_patterns_sums() -> None:
    """Every subset of the ranks 1..n counted by its sum: the exact null distribution."""
    for n in range(1, 9):
        brute = [0] * (n * (n + 1) // 2 + 1)
        for signs in itertools.product((0, 1), repeat=n):
            brute[sum(r for r, s in zip(range(1, n + 1), signs, strict=True) if s)] += 1
        assert signed_rank_counts(n) == brute


def _coverage(low: float, high: float, values: list[float]) -> float:
    """The exact coverage, for the true centre 0 under symmetric noise, of the interval
    rule applied to ``values`` sign-flipped every way: its share of the 2**n patterns whose
    interval holds 0 (the definition of the Wilcoxon interval's level)."""
    held = 0
    patterns = list(itertools.product((-1, 1), repeat=len(values)))
    for signs in patterns:
        flipped = [s * v for s, v in zip(signs, values, strict=True)]
        interval = wilcoxon_interval(flipped)
        held += interval.low <= 0 <= interval.high
    return held / len(patterns)


@pytest.mark.parametrize("n", [5, 6, 8, 10])
def test_the_interval_covers_as_often_as_it_says(n: int) -> None:
    """Over every sign pattern of ``n`` distinct magnitudes (continuous noise: no ties), the
    interval holds the centre exactly as often as its stated level; 5 values cannot reach
    95% and say so (1 - 2 / 32)."""
    values = [0.1 * (k + 1) + 0.013 * k * k for k in range(n)]
    interval = wilcoxon_interval(values)
    assert _coverage(interval.low, interval.high, values) == pytest.approx(interval.confidence)
    if n == 5:
        assert interval.confidence == pytest.approx(1 - 2 / 32)
    else:
        assert interval.confidence >= 0.95


def test_estimate_and_bounds_are_walsh_averages_in_order() -> None:
    values = [3.0, 1.0, 2.0, 7.0, 5.0, 4.0]
    walsh = sorted((values[i] + values[j]) / 2 for i in range(6) for j in range(i, 6))
    interval = wilcoxon_interval(values)
    # n = 6: only the outermost averages reach 95% (1 - 2/64); the median of the 21.
    assert (interval.low, interval.high) == (walsh[0], walsh[-1])
    assert interval.estimate == walsh[10]
    assert interval.confidence == pytest.approx(1 - 2 / 64)


def test_ratios_are_taken_on_the_log_scale() -> None:
    rng = random.Random(0)
    ratios = [0.8 * math.exp(rng.gauss(0, 0.05)) for _ in range(9)]
    interval = ratio_interval(ratios)
    logs = wilcoxon_interval([math.log(r) for r in ratios])
    assert interval.estimate == pytest.approx(math.exp(logs.estimate))
    assert interval.low < 0.8 < interval.high < 0.9
    assert format_interval(interval).startswith(f"{interval.estimate:.2f} [")
    with pytest.raises(ConfigError, match="positive"):
        ratio_interval([1.0, 0.0])
    with pytest.raises(ConfigError, match="at least one"):
        wilcoxon_interval([])
