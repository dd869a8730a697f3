"""``benchmarks/_headline/paired.py``: the rotated orders of alternating repeats, which link
of a pair goes first, and a run's shaped / unshaped pair with its exposed communication."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
paired = importlib.import_module("_headline.paired")


def test_rotated_orders() -> None:
    items = ["a", "b", "c"]
    assert [paired.rotated(items, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert paired.rotated([], 3) == []


@pytest.mark.parametrize("n", [5, 6])
def test_shaped_first_alternates_for_every_strategy(n: int) -> None:
    """Over 6 repeats every strategy starts 3 times on each link, alternating, whatever the
    number of strategies (the parity of the rotated position, ``(j - r) mod 5``, would
    start strategy 0 shaped in repeats 0 and 1 both)."""
    for j in range(n):
        firsts = [paired.shaped_first(r, j) for r in range(6)]
        assert sum(firsts) == 3
        assert all(a != b for a, b in itertools.pairwise(firsts))  # alternates
    # Neighbours in a repeat start on opposite links.
    assert paired.shaped_first(0, 0) != paired.shaped_first(0, 1)


def test_run_pair_runs_both_links_in_order_and_subtracts(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    calls: list[bool] = []

    def run(*, unshaped: bool) -> dict[str, Any]:
        calls.append(unshaped)
        return headline_run(300.0 if unshaped else 400.0, cpu_ms=70.0 if unshaped else 80.0)

    record = paired.run_pair(run, first_shaped=False)
    assert calls == [True, False] and record["pair_order"] == ["unshaped", "shaped"]
    # exposed = 400 - 300 = 100 ms, its share 100 / 400 = 25% of the shaped step.
    assert record["exposed_ms"] == pytest.approx(100.0)
    assert record["exposed_share"] == pytest.approx(0.25)
    assert record["step_time_ms"]["median"] == 400.0  # the record is the shaped run
    assert record["unshaped"]["step_time_ms"]["median"] == 300.0
    assert record["unshaped"]["cpu_ms_per_rank"] == 70.0
    calls.clear()
    assert paired.run_pair(run, first_shaped=True)["pair_order"] == ["shaped", "unshaped"]
    assert calls == [False, True]


def test_run_pair_reports_no_exposure_on_loopback(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    def run(*, unshaped: bool) -> dict[str, Any]:
        return headline_run(310.0 if unshaped else 300.0) | {"cluster_mode": "loopback"}

    record = paired.run_pair(run, first_shaped=True)
    assert record["exposed_ms"] is None and "loopback" in record["exposed_note"]
    assert "unshaped" not in record
