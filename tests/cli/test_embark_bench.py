"""``embark-bench`` end to end: both baselines on the emulated cluster, stable JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.cli.embark_bench import main
from lightning_embark.testing import TINY_BENCH_ARGS


@pytest.mark.multiprocess
def test_bench_writes_schema_and_fp16_moves_fewer_inter_host_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "r.json"
    code = main(
        [
            *TINY_BENCH_ARGS,
            "--strategies",
            "torchrec,torchrec-fp16",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "torchrec-fp16" in printed and "rows capped" in printed
    result = json.loads(out.read_text())
    assert result["config"]["cluster"]["mode"] in ("netns", "loopback")
    runs = {run["strategy"]: run for run in result["runs"]}
    for run in runs.values():
        assert set(run["step_time_ms"]) == {"median", "p10", "p90"}
        assert (
            run["samples_per_s"] > 0 and 0.0 <= run["comm_share"] <= 1.0 and run["peak_rss_mb"] > 0
        )
        assert run["bytes_per_step"]["inter_host"] > 0
        assert "all_to_all_single" in run["bytes_per_step"]["by_collective"]
        assert run["num_measured_steps"] == 3
    assert (
        runs["torchrec-fp16"]["bytes_per_step"]["inter_host"]
        < runs["torchrec"]["bytes_per_step"]["inter_host"]
    )


def test_bench_reports_bad_options() -> None:
    assert main(["--model", "demo-small", "--strategies", "nope"]) == 2
