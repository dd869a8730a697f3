"""``benchmarks/_headline/figure.py``: the dense exchange's wire time and the stacking split
of a step, against values worked by hand."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
figure = importlib.import_module("_headline.figure")


def test_dense_wire_and_stacking_split_by_hand() -> None:
    # 10 MB over 2 hosts: 5 MB per host link = 40 Mbit at 800 Mbit/s = 50 ms
    assert figure.dense_wire_ms(10e6, num_hosts=2, rate_mbit=800) == pytest.approx(50.0)
    assert figure.dense_wire_ms(10e6, num_hosts=2, rate_mbit=None) == 0.0
    assert figure.stack_split(100.0, 0.4, 30.0) == pytest.approx((30.0, 40.0, 30.0))
    # Dense capped at what the exchange leaves: 100 - 40 = 60.
    assert figure.stack_split(100.0, 0.4, 80.0) == pytest.approx((0.0, 40.0, 60.0))
    assert sum(figure.stack_split(250.0, 0.37, 12.5)) == pytest.approx(250.0)
