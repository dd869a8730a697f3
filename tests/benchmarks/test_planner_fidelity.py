"""``benchmarks/planner_fidelity.py --replot``: table, figures and plot from a saved run (no
cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]


def _row(plan: str, predicted: float, measured: float) -> dict:
    return {
        "plan": plan,
        "predicted_ms": predicted,
        "measured_ms": measured,
        "p10_ms": 0.9 * measured,
        "p90_ms": 1.1 * measured,
        "error": (predicted - measured) / measured,
    }


def test_replot_prints_the_table_and_draws_the_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fidelity = load_module(
        REPO / "benchmarks" / "planner_fidelity.py", "planner_fidelity_under_test"
    )
    saved = tmp_path / "run.json"
    rows = [
        _row("a", 100.0, 110.0),
        _row("b", 200.0, 180.0),
        _row("c", 400.0, 500.0),
        _row("d", 300.0, 240.0),
    ]
    saved.write_text(
        json.dumps(
            {
                "rows": rows,
                "args": {"model": "demo-small"},
                "calibration": {"source": "measured: test"},
            }
        )
    )
    png = tmp_path / "fidelity.png"
    assert fidelity.main(["--replot", str(saved), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| c | 400.0 | 500.0 (450-550) | -20% |" in out
    # ranks: predicted a<b<d<c, measured a<b<d<c -> 1.0; |errors| 9%, 11%, 20%, 25% -> median 15.5%
    assert "Spearman 1.00" in out and "median absolute error 16%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
