"""``benchmarks/towers_criteo_auc.py``: its random partition, and a ``--smoke`` run on the
real Criteo sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.data import criteo_spec
from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "towers_criteo_auc.py"
DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"


def test_the_random_partition_keeps_sizes_modules_and_tables() -> None:
    bench = load_module(SCRIPT, "_towers_criteo_auc")
    spec = criteo_spec(1000, 16)
    towers = bench.partitioned(spec, 2, "projection", 4.0, None, 0)
    assert sorted(t for tower in towers for t in tower.tables) == sorted(spec.feature_names)
    shuffled = bench.shuffled(towers, seed=0)
    assert [len(t.tables) for t in shuffled] == [len(t.tables) for t in towers]
    assert [t.module for t in shuffled] == [t.module for t in towers]
    assert sorted(t for tower in shuffled for t in tower.tables) == sorted(spec.feature_names)
    assert [t.tables for t in shuffled] != [t.tables for t in towers]
    assert bench.shuffled(towers, seed=0) == shuffled  # deterministic per seed


@pytest.mark.skipif(not DATA.is_file(), reason=f"the Criteo sample {DATA} is not present")
def test_smoke_run_prints_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bench = load_module(SCRIPT, "_towers_criteo_auc")
    out = tmp_path / "auc.json"
    assert bench.main(["--smoke", "--data", str(DATA), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "flat" in table and "projection r4" in table and "mean AUC" in table
    aucs = json.loads(out.read_text())["aucs"]
    assert set(aucs) == {"flat", "projection r4"}
    assert all(0.0 < v[0] < 1.0 for v in aucs.values())
    assert bench.main(["--smoke", "--data", str(tmp_path / "absent.txt")]) == 2
