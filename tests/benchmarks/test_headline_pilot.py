"""``benchmarks/_headline/pilot.py``: the pilot's rate formula, checked against values worked
by hand, its clamping to the emulation's range and its refusal of a zero share."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
pilot = importlib.import_module("_headline.pilot")


def test_pilot_rate_hits_the_target_share_by_hand() -> None:
    # s = 0.1 at 800: r* = 800 * 0.1 * 0.625 / (0.375 * 0.9) = 148.148...
    assert pilot.pilot_rate(800, 0.1) == pytest.approx(148.1481481, rel=1e-9)
    # s = 0.6 at 800: r* = 800 * 0.6 * 0.625 / (0.375 * 0.4) = 2000
    assert pilot.pilot_rate(800, 0.6) == pytest.approx(2000.0)
    assert pilot.pilot_rate(800, 0.375) == pytest.approx(800.0)  # already there
    # At r* the model's share is the target: E* = s T r / r*, C = (1 - s) T.
    s, r = 0.2, 500.0
    chosen = pilot.pilot_rate(r, s, target=0.3)
    exchange = s * r / chosen
    assert exchange / (exchange + (1 - s)) == pytest.approx(0.3)


def test_pilot_rate_clamps_and_refuses_a_zero_share() -> None:
    assert pilot.pilot_rate(800, 0.999999) == pilot.RATE_MAX_MBIT
    assert pilot.pilot_rate(800, 1.0) == pilot.RATE_MAX_MBIT
    assert pilot.pilot_rate(800, 1e-9) == pilot.RATE_MIN_MBIT
    assert pilot.pilot_rate(800, 0.6, high=1000) == 1000
    with pytest.raises(ValueError, match="--rate-mbit"):
        pilot.pilot_rate(800, 0.0)
    with pytest.raises(ValueError, match="target"):
        pilot.pilot_rate(800, 0.2, target=1.0)
