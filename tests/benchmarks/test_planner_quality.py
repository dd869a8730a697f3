"""``benchmarks/planner_quality.py`` on one small cluster, torchrec's search cut by its own
timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "planner_quality.py"


def test_quality_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--models",
            "mlperf-dlrm-dcnv2",
            "--hosts",
            "1",
            "--ranks-per-host",
            "4",
            "--torchrec-timeout",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mlperf-dlrm-dcnv2" in result.stdout and "mean ratio" in result.stdout
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["hosts"] == 1 and row["ranks_per_host"] == 4 and row["proposer"] == "default"
    assert row["ours_ms"] > 0 and row["torchrec_ms"] > 0 and row["num_proposals"] >= 1
    assert row["towers_ms"] > 0 and "mean towers / ours" in result.stdout
    assert abs(row["ratio"] - row["ours_ms"] / row["torchrec_ms"]) < 1e-9
    assert doc["mean_ratio"] == row["ratio"] and doc["calibration"]["name"] == "dgx-h100"
