"""``benchmarks/criteo_recipe_auc.py``: its tables, and a ``--smoke`` run on the first lines of
the Criteo sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "criteo_recipe_auc.py"
DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"


def _load_script() -> ModuleType:
    """The benchmark script as a module (benchmarks/ is not a package)."""
    return load_module(SCRIPT, "_criteo_recipe_auc")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_script()


def _run(bench: ModuleType, mode: str, seed: int, auc: float, losses: list[float]) -> object:
    return bench.AucRun(
        mode=mode,
        seed=seed,
        world_size=4 if mode == "embark" else 1,
        val_auc=auc,
        val_loss=0.5,
        train_loss=losses,
        steps=len(losses),
        seconds=1.0,
    )


def test_auc_rows_pair_runs_by_seed(bench: ModuleType) -> None:
    runs = [
        _run(bench, "single", 0, 0.7300, [0.7, 0.6]),
        _run(bench, "embark", 0, 0.7299, [0.7, 0.6002]),
        _run(bench, "single", 1, 0.7000, [0.7, 0.5]),
        _run(bench, "embark", 1, 0.7030, [0.7, 0.5]),
    ]
    first, second = bench.auc_rows(runs)
    assert (first.seed, first.within) == (0, True) and first.diff == pytest.approx(-0.0001)
    assert first.max_train_loss_diff == pytest.approx(0.0002)
    assert (second.seed, second.within) == (1, False) and second.diff == pytest.approx(0.003)
    table = bench.format_auc_table([first, second]).splitlines()
    assert table[0] == bench.AUC_HEADER
    assert table[2].startswith("| 0 | 0.7300 | 0.7299 | -0.0001 | yes |")
    assert table[3].startswith("| 1 | 0.7000 | 0.7030 | +0.0030 | NO |")


def test_throughput_ratios_are_per_repeat_medians(bench: ModuleType) -> None:
    def run(strategy: str, samples: float) -> dict:
        return {
            "strategy": strategy,
            "samples_per_s": samples,
            "step_time_ms": {"median": 1000.0 / samples},
            "bytes_per_step": {"inter_host": 2_000_000, "intra_host": 1_000_000},
        }

    runs = [
        run("torchrec", 100),
        run("embark", 80),
        run("torchrec", 50),
        run("embark", 45),
        run("torchrec", 100),
        run("embark", 120),
    ]
    base, embark = bench.summarize_throughput(runs, ("torchrec", "embark"))
    assert base["median_ratio"] == 1.0 and base["median_samples_per_s"] == 100
    assert embark["ratio_per_repeat"] == pytest.approx([0.8, 0.9, 1.2])
    assert embark["median_ratio"] == pytest.approx(0.9)
    assert embark["inter_host_mb_per_step"] == 2.0
    assert "| embark | 80 |" in bench.format_throughput_table([base, embark])


def test_throughput_runs_the_recipe_with_num_nodes(bench: ModuleType, tmp_path: Path) -> None:
    config = bench.ThroughputConfig(data="d.txt", hosts=2, ranks_per_host=2, steps=5, warmup=2)
    argv = bench.recipe_argv(config, "embark", tmp_path)
    assert argv[:2] == [str(REPO / "examples" / "dlrm_criteo.py"), "fit"]
    pairs = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert pairs["--trainer.strategy"] == "embark" and pairs["--trainer.num_nodes"] == "2"
    assert pairs["--trainer.devices"] == "2" and pairs["--trainer.max_steps"] == "7"
    assert pairs["--report_dir"] == str(tmp_path)


@pytest.mark.multiprocess
@pytest.mark.skipif(not DATA.is_file(), reason=f"the Criteo sample {DATA} is not present")
def test_smoke_run_prints_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "auc.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--data", str(DATA), "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = "| seed | single-process val AUC | embark val AUC | difference | within 0.002? |"
    assert any(line.startswith(header) for line in lines)
    (row,) = [line for line in lines if line.startswith("| 0 | ")]
    report = json.loads(out.read_text())
    assert report["tolerance"] == 0.002 and "throughput" not in report
    auc = report["auc"]
    assert auc["config"]["seeds"] == [0] and auc["config"]["max_train_batches"] == 3
    single, embark = auc["runs"]
    assert (single["mode"], single["world_size"], embark["mode"], embark["world_size"]) == (
        "single",
        1,
        "embark",
        4,
    )
    assert single["steps"] == embark["steps"] == 3
    # Same start, same global batches: the runs agree to float summation order.
    assert single["train_loss"] == pytest.approx(embark["train_loss"], rel=1e-4)
    assert abs(single["val_auc"] - embark["val_auc"]) <= 0.002 and "| yes |" in row


def test_missing_data_is_a_clear_error(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--smoke", "--data", str(tmp_path / "absent.txt")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "--data" in err
