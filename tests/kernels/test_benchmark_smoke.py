"""``benchmarks/kernels_gpu.py --smoke`` keeps working without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lightning_embark.wire._codecs import CODECS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_gpu.py"


def test_smoke_run_prints_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    env = {
        k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"
    }  # the script must set it itself
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    header = (
        "| ranks | op | format | triton ms | GB/s | % copy | torch ms | x torch | fbgemm ms "
        "| max |diff| |"
    )
    assert header + " bytes = ref |" in result.stdout
    assert (
        "| pack | 3 | all |" in result.stdout
        and "| unpack (row runs) | 3 | all |" in result.stdout
    )
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert {(r["ranks"], r["op"], r["format"]) for r in rows} == {
        (w, op, name)
        for w in report["shape"]["ranks"]
        for op in ("pack", "unpack")
        for name in CODECS
    }
    assert all(r["max_abs_diff"] == 0.0 and r["bytes_match"] for r in rows)
    assert all(r["triton_ms"] > 0 and r["gbps"] > 0 and r["torch_ms"] > 0 for r in rows)
    assert report["copy_gbps"] > 0
    assert report["checks"] == {"cases": 12, "failed": []}  # 3 cases x 4 ops
    assert any(r["fbgemm_ms"] is not None for r in rows)  # int8/fp16/bf16 codecs exist on CPU
