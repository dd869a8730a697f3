"""``benchmarks/_headline/tables.py``: ratios printed with their intervals, verdicts only
where the interval allows, a tower row that says what it ran, and the table rows."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
tables = importlib.import_module("_headline.tables")


def _stats(estimate: float, low: float, high: float, n: int = 6, level: float = 0.96875) -> dict:
    return {
        "interval": {"estimate": estimate, "low": low, "high": high, "confidence": level, "n": n}
    }


def test_interval_text() -> None:
    assert tables.interval_text(_stats(0.834, 0.781, 0.899)) == "0.83 [0.78, 0.90]"
    assert tables.interval_text(_stats(104.2, 90.0, 120.4), 0) == "104 [90, 120]"
    five = _stats(0.834, 0.781, 0.899, n=5, level=0.9375)
    assert tables.interval_text(five) == "0.83 [0.78, 0.90] (93.8%)"
    assert tables.interval_text(_stats(0.8, 0.8, 0.8, n=1, level=0.0)) == "0.80 [0.80, 0.80] (0%)"
    assert tables.interval_text(None) == ""


def test_verdict_needs_the_upper_bound_below_one() -> None:
    assert tables.verdict(_stats(0.8, 0.7, 0.95), "torchrec") == "faster than torchrec"
    assert tables.verdict(_stats(0.8, 0.7, 1.01), "torchrec") == "not separated from torchrec"
    assert tables.verdict(_stats(1.2, 1.1, 1.3), "x") == "slower than x"
    five = _stats(0.8, 0.7, 0.95, n=5, level=0.9375)
    assert tables.verdict(five, "x") == "faster than x (at 93.8%)"
    assert tables.verdict(_stats(0.5, 0.5, 0.5, n=3), "x") == "none (3 repeat(s))"


def test_strategy_cell_says_what_a_tower_row_ran() -> None:
    def towers(counts: list[int], known: bool = True) -> dict[str, Any]:
        return {
            "towers": {
                "per_repeat": counts,
                "any": any(counts),
                "all": all(counts),
                "known": known,
                "modules": ["identity"] if any(counts) else [],
            }
        }

    label = "embark-towers-compressed"
    assert tables.strategy_cell("embark", {"towers": None}) == "embark"
    assert tables.strategy_cell(label, towers([0, 0])) == f"{label} (no towers chosen: flat)"
    assert tables.strategy_cell(label, towers([2, 2])) == f"{label} (2 identity towers)"
    assert tables.strategy_cell(label, towers([2, 0, 2])) == (
        f"{label} (identity towers in 2/3 repeats)"
    )
    assert "unknown" in tables.strategy_cell(label, towers([0], known=False))
    # A row asked for its input pipeline that trained without one says so.
    unpiped = towers([2, 2]) | {"pipelined": "False"}
    assert (
        tables.strategy_cell(label, unpiped) == f"{label} (2 identity towers; no input pipeline)"
    )
    assert tables.strategy_cell(label, unpiped, pipeline=False) == f"{label} (2 identity towers)"
    assert tables.strategy_cell("embark", {"pipelined": "False/True"}) == (
        "embark (no input pipeline)"
    )
    assert tables.strategy_cell("embark", {"pipelined": "True"}) == "embark"


def _row(step: float, ratios: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "step_ms": {"median": step},
        "ratio": ratios,
        "comm_share": 0.3,
        "spread": {"median": 1.234},
        "cpu_ms_per_rank": 812.4,
        "embedding_inter_mb": 20.5,
        "dense_inter_mb": 1.06,
        "dense_compression": "fp32",
        "dense_exchange": "flat",
        "towers": None,
        **extra,
    }


def test_tables_rows() -> None:
    fp16 = _row(
        400.0,
        {"torchrec-fp16": _stats(1.0, 1.0, 1.0)},
        unshaped_step_ms={"median": 300.0},
        unshaped_ratio={"torchrec-fp16": _stats(1.0, 1.0, 1.0)},
        exposed_ms=_stats(100.4, 90.0, 110.0),
        exposed_share={"median": 0.25},
    )
    embark = _row(
        320.0,
        {"torchrec-fp16": _stats(0.8, 0.75, 0.86)},
        unshaped_step_ms={"median": 280.0},
        unshaped_ratio={"torchrec-fp16": _stats(0.93, 0.9, 0.97)},
        exposed_ms=_stats(40.0, 30.0, 52.0),
        exposed_share={"median": 0.125},
    )
    workload = {
        "title": "T200",
        "key": "t200",
        "model": "hugectr-200table-100B-hotness20",
        "regime": "comm-bound",
        "max_rows": 10000,
        "width": 128,
        "batch_size": 128,
        "dense": {"interaction": "dot", "dense_arch": "128", "over_arch": "128,64,1"},
        "rate_mbit": 407.2,
        "rate_source": "pilot: torchrec-fp16 exposed 25% (landed, 1 run(s))",
        "summary": {"torchrec-fp16": fp16, "embark-compressed": embark},
    }
    labels = ["torchrec-fp16", "embark-compressed"]
    ratio = tables.format_ratio_table([workload], labels, ["torchrec-fp16"])
    assert "| T200 | 407.2 | torchrec-fp16 | 400.0 | - |  |" in ratio
    assert (
        "| T200 | 407.2 | embark-compressed | 320.0 | 0.80 [0.75, 0.86] | "
        "faster than torchrec-fp16 |" in ratio
    )
    time = tables.format_time_table([workload], labels)
    assert (
        "| T200 | embark-compressed | 280.0 | 0.93 [0.90, 0.97] | 40 [30, 52] | 12% | 30% | 812 "
        "| 1.23 | 20.50 | 1.06 | fp32 flat |" in time
    )
    assert "| T200 | torchrec-fp16 | 300.0 | - | 100 [90, 110] | 25% |" in time
    work = tables.format_workloads_table([workload])
    assert work.splitlines()[-1].endswith(
        "| 407.2 | pilot: torchrec-fp16 exposed 25% (landed, 1 run(s)) | 25% |"
    )
