"""``benchmarks/_headline/paired.py``: the rotated orders of alternating repeats, the
quantile, and the paired ratios within repeats, against values worked by hand."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
paired = importlib.import_module("_headline.paired")


def test_rotated_orders_and_quantile() -> None:
    items = ["a", "b", "c"]
    assert [paired.rotated(items, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert paired.quantile([3.0, 1.0, 2.0], 0.1) == pytest.approx(1.2)
    assert paired.quantile([3.0, 1.0, 2.0], 0.9) == pytest.approx(2.8)
    assert paired.quantile([5.0], 0.9) == 5.0


def test_aggregate_pairs_ratios_within_repeats(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    twrw = [100.0, 200.0, 120.0]
    embark = [60.0, 100.0, 90.0]
    repeats = [
        {
            "torchrec-twrw": headline_run(t, share=s),
            "embark": headline_run(e, share=0.1, emb=1_000_000),
        }
        for t, e, s in zip(twrw, embark, (0.3, 0.4, 0.5), strict=True)
    ]
    out = paired.aggregate(repeats, ["torchrec-twrw", "embark"])
    e = out["embark"]
    assert e["step_ms"]["median"] == 90.0
    assert e["step_ms"]["p10"] == pytest.approx(66.0)  # 60 + 0.2 * (90 - 60)
    assert e["step_ms"]["p90"] == pytest.approx(98.0)  # 90 + 0.8 * (100 - 90)
    # Paired: 0.6, 0.5, 0.75 -> 0.6; the ratio of medians would be 90 / 120 = 0.75.
    assert e["ratio"]["torchrec-twrw"]["per_repeat"] == pytest.approx([0.6, 0.5, 0.75])
    assert e["ratio"]["torchrec-twrw"]["median"] == pytest.approx(0.6)
    assert "torchrec-fp16" not in e["ratio"]  # not run: no ratio
    assert out["torchrec-twrw"]["ratio"]["torchrec-twrw"]["median"] == 1.0
    assert out["torchrec-twrw"]["comm_share"] == 0.4
    assert (e["embedding_inter_mb"], e["dense_inter_mb"]) == (1.0, 3.0)
    assert e["dense_compression"] == "fp32" and e["dense_exchange"] == "flat"
    assert e["num_repeats"] == 3
