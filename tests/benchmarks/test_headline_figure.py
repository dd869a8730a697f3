"""``benchmarks/_headline/figure.py``: a bar's split into the unshaped step and the exposed
communication on top, against values worked by hand, and the figure drawn."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
figure = importlib.import_module("_headline.figure")


def _summary(shaped: float, unshaped: float | None, exposed: tuple[float, float, float]) -> dict:
    estimate, low, high = exposed
    if unshaped is None:
        return {"step_ms": {"median": shaped}, "exposed_ms": None, "unshaped_step_ms": None}
    return {
        "step_ms": {"median": shaped},
        "unshaped_step_ms": {"median": unshaped},
        "exposed_ms": {"interval": {"estimate": estimate, "low": low, "high": high}},
    }


def test_stack_split_by_hand() -> None:
    assert figure.stack_split(300.0, 100.0) == (300.0, 100.0)
    assert figure.stack_split(300.0, -12.0) == (300.0, 0.0)  # noise below zero: no part


def test_bars_and_plot(tmp_path: Path) -> None:
    workload: dict[str, Any] = {
        "title": "T200",
        "rate_mbit": 400.0,
        "batch_size": 128,
        "summary": {
            "torchrec-fp16": _summary(410.0, 300.0, (104.0, 90.0, 120.0)),
            "embark": _summary(350.0, None, (0, 0, 0)),
        },
    }
    fp16, embark = figure.bars(workload, ["torchrec-fp16", "embark"])
    # Unshaped 300 + exposed 104 on top; its interval 90..120 drawn at 390..420; tick 410.
    assert (fp16["unshaped"], fp16["exposed"]) == (300.0, 104.0)
    assert (fp16["low"], fp16["high"], fp16["shaped"]) == pytest.approx((390.0, 420.0, 410.0))
    assert fp16["measured"]
    # Without exposed pairs, the shaped step alone, marked as not split.
    assert (embark["unshaped"], embark["exposed"], embark["measured"]) == (350.0, 0.0, False)
    path = tmp_path / "headline.png"
    figure.plot_headline([workload], ["torchrec-fp16", "embark"], path)
    assert path.stat().st_size > 0
