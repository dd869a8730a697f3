"""The paired re-measurement: alternating rounds, ratios, and a verdict that needs evidence."""

from __future__ import annotations

import random

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.search import paired_remeasure


def _noisy(base: dict[str, float], seed: int, noise: float):
    """Step times with a shared per-round machine state (drift) and per-run noise."""
    rng = random.Random(seed)
    state = {"drift": 1.0}

    def measure(label: str) -> float:
        state["drift"] *= rng.uniform(0.9, 1.1)  # the machine drifts between runs
        return base[label] * state["drift"] * rng.uniform(1 - noise, 1 + noise)

    return measure


def test_picks_the_plan_with_the_injected_delay_removed() -> None:
    """Candidate ``b`` is greedy plus a known 20 ms, ``a`` greedy minus 20 ms: at 5% noise and
    10% drift between runs, the paired ratios (about 0.8 and 1.2) separate in every round,
    so ``a`` wins and ``b`` is never declared faster."""
    measure = _noisy({"greedy": 0.100, "a": 0.080, "b": 0.120}, seed=0, noise=0.05)
    result = paired_remeasure(measure, ["a", "b"], pairs=7)
    assert result.winner == "a"
    by_name = {c.name: c for c in result.candidates}
    assert 0.7 < by_name["a"].median < 0.9
    assert by_name["b"].median > 1.1
    assert by_name["a"].p_value <= 2**-7 + 1e-12  # every round below 1: the exact minimum


def test_greedy_stands_when_the_difference_is_noise() -> None:
    """Equal plans under 30% noise: the median ratio may fall below 1, but the test at
    alpha / k = 0.025 rejects it (seeded, so the outcome is fixed)."""
    measure = _noisy({"greedy": 0.1, "a": 0.1, "b": 0.1}, seed=1, noise=0.3)
    result = paired_remeasure(measure, ["a", "b"], pairs=7)
    assert result.winner is None


def test_rounds_alternate_so_drift_cancels() -> None:
    order: list[str] = []
    paired_remeasure(lambda label: order.append(label) or 0.1, ["a", "b"], pairs=2, alpha=0.05)
    assert order == ["greedy", "a", "b", "b", "a", "greedy"]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="pairs"):
        paired_remeasure(lambda _: 0.1, ["a"], pairs=1)
    with pytest.raises(ConfigError, match="no candidate"):
        paired_remeasure(lambda _: 0.1, [], pairs=3)
