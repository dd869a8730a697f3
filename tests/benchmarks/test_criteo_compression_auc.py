"""``benchmarks/criteo_compression_auc.py``: its plans, and a ``--smoke`` run on the real Criteo
sample."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from lightning_embark.data import criteo_spec
from lightning_embark.plan._types import ClusterType, Compression
from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "criteo_compression_auc.py"
DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"

RUN_FIELDS = {
    "compression",
    "seed",
    "val_auc",
    "val_logloss",
    "val_rows",
    "train_loss",
    "steps",
    "seconds",
}
SUMMARY_FIELDS = {
    "compression",
    "auc_mean",
    "aucs",
    "delta_auc",
    "max_seed_delta",
    "logloss_mean",
    "delta_logloss",
    "within",
}


def _load_script() -> ModuleType:
    """The benchmark script as a module (benchmarks/ is not a package)."""
    return load_module(SCRIPT, "_criteo_compression_auc")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_script()


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_plans_differ_only_in_compression(bench: ModuleType, world_size: int) -> None:
    spec = criteo_spec(1000, 16)
    fp32 = bench.exchange_plan(spec, world_size, "fp32")
    assert [c.type for c in fp32.clusters] == [ClusterType.RB]
    assert {t.table for t in fp32.tables} == set(spec.feature_names)
    for name in ("fp16", "bf16", "fp8", "int8"):
        plan = bench.exchange_plan(spec, world_size, name)
        assert plan.tables == fp32.tables
        (cluster,) = plan.clusters
        assert cluster.forward_compression is Compression(name)
        assert cluster.backward_compression is Compression(name)
        assert (
            dataclasses.replace(cluster, forward_compression="fp32", backward_compression="fp32")
            == fp32.clusters[0]
        )


def test_plan_mixes_layouts_on_two_ranks(bench: ModuleType) -> None:
    plan = bench.exchange_plan(criteo_spec(1000, 16), 2, "fp8")
    shapes = {(t.num_row_shards, t.num_col_shards) for t in plan.tables}
    assert shapes == {(1, 1), (2, 1), (1, 2)}
    assert {t.ranks[0][0] for t in plan.tables if t.num_row_shards * t.num_col_shards == 1} == {
        0,
        1,
    }


def test_summary_pairs_seeds_against_fp32(bench: ModuleType) -> None:
    config = bench.BenchConfig(data="x", seeds=(0, 1), compressions=("int8",))
    aucs = {("fp32", 0): 0.70, ("fp32", 1): 0.72, ("int8", 0): 0.695, ("int8", 1): 0.71}
    runs = [
        bench.RunResult(
            compression=c,
            seed=s,
            val_auc=a,
            val_logloss=0.5,
            val_rows=10,
            train_loss=[],
            steps=1,
            seconds=0.0,
        )
        for (c, s), a in aucs.items()
    ]
    fp32, int8 = bench.summarize(runs, config)
    assert fp32.delta_auc == 0.0 and fp32.within
    assert int8.aucs == [0.695, 0.71]
    assert int8.delta_auc == pytest.approx(-0.0075)
    assert int8.max_seed_delta == pytest.approx(0.01)
    assert not int8.within
    table = bench.format_table([fp32, int8])
    assert table.splitlines()[0] == bench.TABLE_HEADER
    assert "| int8 | 0.7025 | 0.6950, 0.7100 | -0.0075 | NO |" in table


@pytest.mark.multiprocess
@pytest.mark.skipif(not DATA.is_file(), reason=f"the Criteo sample {DATA} is not present")
def test_smoke_run_prints_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "auc.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--data",
            str(DATA),
            "--compressions",
            "fp8,int8",
            "--dense-compression",
            "bf16",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert (
        "| compression | AUC mean | per-seed AUCs | delta vs fp32 | within 0.005? |"
        in lines[lines.index("") + 1]
    )
    assert any(line.startswith("| fp32 | ") and "(reference)" in line for line in lines)
    assert any(line.startswith("| fp8 | ") for line in lines)
    assert not any(line.startswith("| int8 | ") for line in lines), (
        "smoke runs the first compression only"
    )

    report = json.loads(out.read_text())
    assert report["config"]["seeds"] == [0] and report["config"]["max_steps"] == 4
    assert report["config"]["dense_compression"] == "bf16"
    assert report["tolerance"] == 0.005 and report["total_seconds"] > 0
    runs = report["runs"]
    assert [(r["compression"], r["seed"]) for r in runs] == [("fp32", 0), ("fp8", 0)]
    for run in runs:
        assert set(run) == RUN_FIELDS
        assert 0.0 <= run["val_auc"] <= 1.0 and run["val_logloss"] > 0
        assert run["steps"] == 4 and len(run["train_loss"]) == 4
        assert run["val_rows"] > 1500  # every row of the 20% split, not whole batches only
    assert runs[0]["val_rows"] == runs[1]["val_rows"]
    assert [s["compression"] for s in report["summary"]] == ["fp32", "fp8"]
    assert all(set(s) == SUMMARY_FIELDS for s in report["summary"])


def test_missing_data_is_a_clear_error(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--smoke", "--data", str(tmp_path / "absent.txt")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "--data" in err
