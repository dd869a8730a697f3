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


def test_bench_refuses_identity_towers_for_torchrec_towers(capsys: pytest.CaptureFixture) -> None:
    """torchrec wraps each tower module in DDP, which refuses a module without parameters:
    the bench says so before starting any job."""
    assert main(["--model", "demo-small", "--strategies", "embark-towers,torchrec-towers"]) == 2
    error = capsys.readouterr().err
    assert "torchrec-towers cannot run identity towers" in error
    assert "embedding_tower_sharding.py:604" in error and "--tower-module projection" in error


@pytest.mark.multiprocess
def test_bench_runs_torchrecs_towers_and_reports_their_bytes(tmp_path: Path) -> None:
    """``torchrec-towers``: torchrec's own tower sharding over the bench's towers (demo-small's
    8 tables of width 32 in 2 towers of 4, ratio-4 projections: 32 columns out each) on
    2 hosts x 1 rank. Every tower output crosses hosts, forward and its gradient backward,
    fp32: 2 ranks x 32 samples x 32 columns x 4 bytes x 2 = 16,384 bytes per step; the raw
    IDs of the other host's tower cross too, so the embedding exchange is more than that.
    The plan keeps the tower collection whole, one tower per host."""
    out = tmp_path / "r.json"
    code = main(
        [
            *TINY_BENCH_ARGS,
            "--strategies",
            "torchrec-towers",
            "--tower-module",
            "projection",
            "--tower-ratio",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["strategy"] == "torchrec-towers:projection"
    per_step = run["bytes_per_step"]
    assert per_step["embedding_inter_host"] > 16_384
    assert per_step["by_collective"]["all_to_all_single"]["inter_host"] > 16_384
    assert per_step["intra_host"] == 0  # one rank per host: nothing to exchange inside one
    summary = run["plan_summary"]
    assert "model.towers:" in summary.splitlines()
    tables = [line for line in summary.splitlines() if "ranks=[" in line]
    assert all("table_row_wise" in t or "table_column_wise" in t for t in tables), summary
    hosts = sorted(int(t.rsplit("[", 1)[1].rstrip("]")) for t in tables)
    assert hosts == [0] * 4 + [1] * 4, summary  # one tower of 4 tables on each host
