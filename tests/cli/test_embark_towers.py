"""``embark-towers``: a warm-up run on the real Criteo sample writes towers that the
planner and the model take, reports balance and kept affinity, plots, reuses a saved
affinity, and refuses contradictory options with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.cli import embark_towers
from lightning_embark.plan import TowerModule, load_towers

DATA = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "criteo-autorec-train-10k.txt"
)
COMMON = ["--model", "mlperf-dlrm-dcnv2", "--max-rows", "2000", "--hosts", "2"]
COMMON += ["--ranks-per-host", "2", "--batch-size", "64"]


@pytest.mark.skipif(not DATA.is_file(), reason=f"the Criteo sample {DATA} is not present")
def test_warm_up_towers_plot_and_reuse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, plot, saved = tmp_path / "towers.json", tmp_path / "a.png", tmp_path / "aff.json"
    argv = [*COMMON, "--data", str(DATA), "--warmup-steps", "8", "--tower-module", "projection"]
    argv += ["--tower-ratio", "4", "--out", str(out), "--plot", str(plot)]
    assert embark_towers.main([*argv, "--affinity-out", str(saved)]) == 0
    printed = capsys.readouterr().out
    assert "balance: costliest tower" in printed and "affinity kept inside towers" in printed
    assert "estimated step" in printed
    towers = load_towers(out)
    assert len(towers) == 2 and all(t.module is TowerModule.PROJECTION for t in towers)
    assert sorted(n for t in towers for n in t.tables) == sorted(f"C{i}" for i in range(1, 27))
    assert plot.stat().st_size > 10_000
    assert len(json.loads(saved.read_text())["features"]) == 26
    again = tmp_path / "again.json"
    reuse = [*COMMON, "--affinity", str(saved), "--tower-module", "projection"]
    assert embark_towers.main([*reuse, "--tower-ratio", "4", "--out", str(again)]) == 0
    assert load_towers(again) == towers  # the partition depends only on the affinity


def test_without_affinity_the_partition_is_statistics_only(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "towers.json"
    assert embark_towers.main([*COMMON, "--towers", "3", "--out", str(out)]) == 0
    assert "statistics-only" in capsys.readouterr().out
    assert len(load_towers(out)) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data", "x", "--affinity", "y"], "not both"),
        (["--plot", "p.png"], "--plot draws the affinity"),
        (["--tower-module", "dcn"], "needs --tower-ratio"),
        (["--tower-ratio", "2"], "needs a compressing --tower-module"),
    ],
)
def test_contradictory_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str
) -> None:
    argv = [*COMMON, *extra, "--out", str(tmp_path / "t.json")]
    assert embark_towers.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
