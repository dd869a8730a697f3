"""``embark-calibrate``: help, option errors, and a small run whose output embark-plan reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.cli import embark_calibrate as cli_calibrate
from lightning_embark.cli import embark_plan as cli_plan
from lightning_embark.planner._hardware import load_calibration


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_calibrate.main(["--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: embark-calibrate")
    for option in (
        "--out",
        "--hosts",
        "--ranks-per-host",
        "--rate-mbit",
        "--sizes",
        "--repeats",
        "--raw",
    ):
        assert option in printed


def test_bad_sizes_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_calibrate.main(["--out", str(tmp_path / "c.json"), "--sizes", "4K"]) == 2
    assert "at least two distinct sizes" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.multiprocess
def test_small_run_writes_a_calibration_embark_plan_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, raw = tmp_path / "calib.json", tmp_path / "raw.json"
    code = cli_calibrate.main(
        [
            "--out",
            str(out),
            "--raw",
            str(raw),
            "--hosts",
            "1",
            "--ranks-per-host",
            "2",
            "--loopback",
            "--sizes",
            "64K,1M,4M",
            "--repeats",
            "2",
            "--lookup-rows",
            "2000",
            "--lookup-batch",
            "64",
            "--dim",
            "16",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "alltoall_intra" in printed and f"wrote {out}" in printed
    calib = load_calibration(out)
    assert calib.source.startswith("measured: embark-calibrate, gloo 1 host(s) x 2")
    assert calib.intra_bandwidth > 0 and calib.memory_per_rank and calib.memory_per_rank > 0
    assert "copied from intra-host" in calib.source
    assert json.loads(raw.read_text())["measured"]["world"] == 2
    plan_out = tmp_path / "plan.json"
    assert (
        cli_plan.main(
            [
                "--model",
                "demo-small",
                "--topology",
                str(out),
                "--hosts",
                "1",
                "--batch-size",
                "64",
                "--out",
                str(plan_out),
            ]
        )
        == 0
    )
    assert json.loads(plan_out.read_text())["estimate"]["step_time_ms"] > 0
