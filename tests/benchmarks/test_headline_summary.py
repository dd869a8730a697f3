"""``benchmarks/_headline/summary.py``: the statistics of a row over paired repeats (paired
ratios, unshaped ratios, exposed ms, spread, CPU, towers), against values worked by hand.

With 6 repeats the exact Wilcoxon signed-rank interval at 95% is the widest one, from the
smallest to the largest Walsh average (``P(T = 0) = 1/64`` per side: level
``1 - 2/64 = 96.875%``; the next depth would give ``1 - 4/64 = 93.75%``), i.e. the least
and the greatest paired value: that is what makes the intervals below checkable by hand.
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
summary = importlib.import_module("_headline.summary")


def test_quantile() -> None:
    assert summary.quantile([3.0, 1.0, 2.0], 0.1) == pytest.approx(1.2)
    assert summary.quantile([3.0, 1.0, 2.0], 0.9) == pytest.approx(2.8)
    assert summary.quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError):
        summary.quantile([], 0.5)


def _hodges_lehmann_of_logs(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    n = len(logs)
    walsh = [(logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n)]
    return math.exp(statistics.median(walsh))


def test_ratios_paired_within_repeats(headline_run: Callable[..., dict[str, Any]]) -> None:
    torchrec = [100.0, 200.0, 120.0, 150.0, 110.0, 130.0]
    embark = [60.0, 100.0, 90.0, 120.0, 99.0, 91.0]
    repeats = [
        {"torchrec": headline_run(t, share=0.3), "embark": headline_run(e, emb=1_000_000)}
        for t, e in zip(torchrec, embark, strict=True)
    ]
    out = summary.summarize(repeats, ["torchrec", "embark"])
    e = out["embark"]
    paired = [0.6, 0.5, 0.75, 0.8, 0.9, 0.7]
    ratio = e["ratio"]["torchrec"]
    assert ratio["per_repeat"] == pytest.approx(paired)
    assert ratio["median"] == pytest.approx(0.725)  # (0.7 + 0.75) / 2
    interval = ratio["interval"]
    assert (interval["low"], interval["high"]) == pytest.approx((0.5, 0.9))  # min, max
    assert interval["confidence"] == pytest.approx(1 - 2 / 64)
    assert interval["estimate"] == pytest.approx(_hodges_lehmann_of_logs(paired))
    assert interval["n"] == 6
    # Not the ratio of medians: 95.0 / 125.0 = 0.76.
    assert e["step_ms"]["median"] == 95.0
    assert "torchrec-fp16" not in e["ratio"]  # not run: no ratio
    assert out["torchrec"]["ratio"]["torchrec"]["median"] == 1.0
    assert (e["embedding_inter_mb"], e["dense_inter_mb"]) == (1.0, 3.0)
    assert e["cpu_ms_per_rank"] == 50.0 and e["num_repeats"] == 6
    assert e["exposed_ms"] is None and e["unshaped_step_ms"] is None  # no pairs ran
    assert e["towers"] is None


def _paired_run(
    headline_run: Callable[..., dict[str, Any]], shaped: float, unshaped: float, **kw: Any
) -> dict[str, Any]:
    run = headline_run(shaped, **kw)
    run["unshaped"] = {"step_time_ms": {"median": unshaped}, "cpu_ms_per_rank": 40.0}
    run["exposed_ms"] = shaped - unshaped
    run["exposed_share"] = (shaped - unshaped) / shaped
    return run


def test_exposed_unshaped_ratio_and_spread(headline_run: Callable[..., dict[str, Any]]) -> None:
    # Exposed ms of embark: 400-300, 420-310, 390-300, 410-290, 405-305, 400-296.
    shaped = [400.0, 420.0, 390.0, 410.0, 405.0, 400.0]
    unshaped = [300.0, 310.0, 300.0, 290.0, 305.0, 296.0]
    fp16_unshaped = [250.0, 250.0, 240.0, 260.0, 250.0, 250.0]
    spreads = [1.1, 1.2, 1.3, 1.1, 1.5, 1.2]
    repeats = [
        {
            "torchrec-fp16": _paired_run(headline_run, 380.0, u16),
            "embark": _paired_run(headline_run, s, u, spread=sp),
        }
        for s, u, u16, sp in zip(shaped, unshaped, fp16_unshaped, spreads, strict=True)
    ]
    e = summary.summarize(repeats, ["torchrec-fp16", "embark"])["embark"]
    exposed = [100.0, 110.0, 90.0, 120.0, 100.0, 104.0]
    assert e["exposed_ms"]["per_repeat"] == pytest.approx(exposed)
    assert e["exposed_ms"]["median"] == pytest.approx(102.0)
    interval = e["exposed_ms"]["interval"]
    assert (interval["low"], interval["high"]) == pytest.approx((90.0, 120.0))
    assert e["exposed_share"]["median"] == pytest.approx(
        statistics.median(x / s for x, s in zip(exposed, shaped, strict=True))
    )
    assert e["unshaped_step_ms"]["median"] == pytest.approx(300.0)
    # Unshaped paired ratios: 300/250, 310/250, 300/240, 290/260, 305/250, 296/250.
    unshaped_ratio = e["unshaped_ratio"]["torchrec-fp16"]
    assert unshaped_ratio["per_repeat"] == pytest.approx([1.2, 1.24, 1.25, 290 / 260, 1.22, 1.184])
    assert unshaped_ratio["interval"]["low"] == pytest.approx(290 / 260)
    assert unshaped_ratio["interval"]["high"] == pytest.approx(1.25)
    assert e["spread"]["per_repeat"] == pytest.approx(spreads)
    assert e["spread"]["median"] == pytest.approx(1.2)
    assert e["unshaped_cpu_ms_per_rank"] == 40.0


def test_towers_over_repeats(headline_run: Callable[..., dict[str, Any]]) -> None:
    def rep(count: int) -> dict[str, Any]:
        use = {
            "known": True,
            "count": count,
            "modules": ["identity"] if count else [],
            "tables": 4,
        }
        return {"embark-towers-compressed": headline_run(100.0) | {"towers": use}}

    none = summary.summarize([rep(0), rep(0)], ["embark-towers-compressed"])
    towers = none["embark-towers-compressed"]["towers"]
    assert towers["per_repeat"] == [0, 0] and not towers["any"] and not towers["all"]
    some = summary.summarize([rep(2), rep(0)], ["embark-towers-compressed"])
    towers = some["embark-towers-compressed"]["towers"]
    assert towers["any"] and not towers["all"] and towers["modules"] == ["identity"]
