"""``embark-calibrate``: help, option errors, and a small run whose output embark-plan reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_embark.cli import embark_calibrate as cli_calibrate
from lightning_embark.cli import embark_plan as cli_plan
from lightning_embark.errors import EmbarkError
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.testing import load_module


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
        "--device",
        "--from-raw",
    ):
        assert option in printed


def test_bad_sizes_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_calibrate.main(["--out", str(tmp_path / "c.json"), "--sizes", "4K"]) == 2
    assert "at least two distinct sizes" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_cluster_shape_per_device() -> None:
    """The CPU emulates 2 x 2 by default; CUDA is this machine's GPUs, one rank each, as
    one host (emulated hosts on one machine would measure NVLink as the inter-host link)."""
    assert cli_calibrate.cluster_shape("cpu", None, None, gpus=0) == (2, 2)
    assert cli_calibrate.cluster_shape("cpu", 3, 4, gpus=0) == (3, 4)
    assert cli_calibrate.cluster_shape("cuda", None, None, gpus=8) == (1, 8)
    assert cli_calibrate.cluster_shape("cuda", 1, 4, gpus=8) == (1, 4)
    with pytest.raises(EmbarkError, match="--from-raw"):
        cli_calibrate.cluster_shape("cuda", 2, 4, gpus=8)
    with pytest.raises(EmbarkError, match="this machine has 2"):
        cli_calibrate.cluster_shape("cuda", None, 4, gpus=2)
    with pytest.raises(EmbarkError, match="at least 2 GPUs, got 1"):
        cli_calibrate.cluster_shape("cuda", None, None, gpus=1)


def test_the_worker_runs_on_the_chosen_device() -> None:
    argv = cli_calibrate.worker_argv(
        cli_calibrate.build_parser().parse_args(["--out", "x.json"]), [4, 8], Path("r"), "cuda"
    )
    assert argv[argv.index("--device") + 1] == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_calibrate.main(["--out", str(tmp_path / "c.json"), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_from_raw_fits_measurements_taken_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU cluster's worker output (NCCL, cuda) fits into a calibration that says so."""
    synthetic_measurement = load_module(
        Path(__file__).resolve().parents[1] / "calibration" / "test_fit.py",
        "_embark_calibration_fit_tests",
    )._synthetic_measurement
    raw = tmp_path / "raw.json"
    raw.write_text(
        json.dumps(
            dict(synthetic_measurement(), backend="nccl", device="cuda", device_name="NVIDIA H100")
        )
    )
    out = tmp_path / "calib.json"
    code = cli_calibrate.main(["--from-raw", str(raw), "--out", str(out)])
    assert code == 0, capsys.readouterr()
    calib = load_calibration(out)
    assert calib.source.startswith("measured: embark-calibrate, nccl 2 host(s) x 2 on cuda")
    assert f"fitted from {raw}" in calib.source
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli_calibrate.main(["--from-raw", str(bad), "--out", str(out)]) == 2
    assert "holds no calibration measurements" in capsys.readouterr().err


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
    assert calib.source.startswith("measured: embark-calibrate, gloo 1 host(s) x 2 on cpu")
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
