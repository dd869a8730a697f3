"""``benchmarks/gpucheck_compile.py``: the GPU check's kernel specializations recorded in the
interpreter, a sample compiled for sm_90 (no GPU needed), and the estimate made from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_estimate_is_counts_times_mean_compile_times(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    script = ROOT / "benchmarks" / "gpucheck_compile.py"
    args = ["--kernel-cases", "2", "--sample", "1", "--timing-batch", "64", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    for name in ("pack", "unpack"):
        # Two cases launch every op at least once, and the engine's layouts add their own.
        assert result[name]["variants"] >= 4 and result[name]["compiled"] == 1
        assert result[name]["mean_s"] > 0
    expected = sum(result[n]["variants"] * result[n]["mean_s"] for n in ("pack", "unpack"))
    assert abs(result["estimated_compile_s"] - expected) < 1e-9
    assert "estimated compile time of a first CUDA run with 2 kernel cases" in done.stdout
