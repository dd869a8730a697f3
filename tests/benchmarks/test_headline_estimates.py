"""``benchmarks/_headline/estimates.py``: whether torchrec's search finished or was cut is
read from the planner's answer and said in each torchrec row's note."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import lightning_embark.baseline as baseline
from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
estimates = importlib.import_module("_headline.estimates")


def test_search_note() -> None:
    assert estimates.search_note(False, 12.34, 600) == "torchrec's search finished in 12.3 s"
    assert estimates.search_note(True, 600.2, 600) == (
        "torchrec's search cut at 600 s (its best plan by then)"
    )


@pytest.mark.parametrize("cut", [False, True])
def test_torchrec_plan_reports_its_search(monkeypatch: pytest.MonkeyPatch, cut: bool) -> None:
    asked: dict[str, Any] = {}

    def fake_plan(spec: Any, **kw: Any) -> Any:
        asked.update(kw)
        return SimpleNamespace(plan="sharding", timed_out=cut, search_seconds=42.0)

    monkeypatch.setattr(baseline, "torchrec_plan", fake_plan)
    monkeypatch.setattr(baseline, "plan_from_torchrec", lambda sharding, spec, **kw: "ours")
    plan, search = estimates._torchrec_plan(
        "spec",
        hosts=8,
        ranks_per_host=8,
        batch_size=4096,
        topology=None,
        timeout=600,
        sharding_types=None,
    )
    assert plan == "ours" and asked["timeout_seconds"] == 600
    assert search["finished"] is not cut and search["search_s"] == 42.0
    assert search["note"] == estimates.search_note(cut, 42.0, 600)
