"""``embark-bench`` end to end: both baselines on the emulated cluster, stable JSON schema."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from lightning_embark.cli.embark_bench import main
from lightning_embark.emulation import DEFAULT_RATE_MBIT
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
    # The tower modules' all-reduce is the towers' traffic (as embark-towers labels it), out
    # of the dense part: one call per rank and step, of no bytes over a host's one rank.
    towers = per_step["by_traffic"]["towers:modules"]
    assert towers == {"intra_host": 0, "inter_host": 0, "calls": 2}
    summary = run["plan_summary"]
    assert "model.towers:" in summary.splitlines()
    tables = [line for line in summary.splitlines() if "ranks=[" in line]
    assert all("table_row_wise" in t or "table_column_wise" in t for t in tables), summary
    hosts = sorted(int(t.rsplit("[", 1)[1].rstrip("]")) for t in tables)
    assert hosts == [0] * 4 + [1] * 4, summary  # one tower of 4 tables on each host


@pytest.mark.multiprocess
def test_bench_runs_twrw_with_one_dense_exchange_and_says_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``torchrec-twrw`` beside ``torchrec``, both with bf16 dense gradients: every table
    table-row-wise, every row records its dense exchange (the table's ``dense`` column),
    the dense bytes are labelled apart from the embedding bytes and, the dense part being
    the same model in the same format, equal in both rows; the bench announces each
    strategy and shows rank 0's progress over its 1 + 3 steps; the JSON records the link's
    rate (the emulation's default: no --rate-mbit) and the machine."""
    out = tmp_path / "r.json"
    strategies = "torchrec,torchrec-twrw"
    args = [*TINY_BENCH_ARGS, "--strategies", strategies, "--dense-compression", "bf16"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "[embark-bench] strategy 1/2: torchrec\n" in printed.err
    assert "[embark-bench] strategy 2/2: torchrec-twrw\n" in printed.err
    for index, name in enumerate(strategies.split(","), start=1):
        progress = [
            line for line in printed.out.splitlines() if f"[progress] {name} ({index}/2):" in line
        ]
        assert progress and "4/4" in progress[-1] and "measured" in progress[-1], printed.out
    table = printed.out[printed.out.index("strategy ") :].splitlines()
    assert table[0].split()[-1] == "dense"
    assert [line.split()[-2:] for line in table[2:4]] == [["bf16", "flat"]] * 2

    result = json.loads(out.read_text())
    config = result["config"]
    if config["cluster"]["mode"] == "netns":
        assert config["rate_mbit"] == DEFAULT_RATE_MBIT
        assert config["cluster"]["rate_source"] == "default"
    else:  # namespaces could not be created: loopback, said so
        assert config["rate_mbit"] is None and "loopback" in config["cluster"]["rate_source"]
    machine = config["machine"]
    assert machine["cpu_count"] == os.cpu_count() and machine["torch"] == torch.__version__
    runs = {run["strategy"]: run for run in result["runs"]}
    for run in runs.values():
        assert (run["dense_compression"], run["dense_exchange"]) == ("bf16", "flat")
        per_step = run["bytes_per_step"]
        dense = per_step["by_traffic"]["dense"]["inter_host"]
        assert dense > 0 and per_step["embedding_inter_host"] == (
            per_step["inter_host"] - dense - per_step["by_traffic"]["metrics"]["inter_host"]
        )
        assert per_step["embedding_inter_host"] > 0
    assert (
        len({r["bytes_per_step"]["by_traffic"]["dense"]["inter_host"] for r in runs.values()}) == 1
    )
    tables = [
        line for line in runs["torchrec-twrw"]["plan_summary"].splitlines() if "ranks=" in line
    ]
    assert len(tables) == 8 and all(": table_row_wise (" in t for t in tables), tables
