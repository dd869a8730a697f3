"""``benchmarks/towers_quality.py``: its paired interval, its partitions, and a ``--smoke``
run on the real MovieLens-1M sample."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from lightning_embark.data import ctr_spec
from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "towers_quality.py"
DATA = REPO.parent / "shared" / "data"
# Loading the script puts its folder, where its package lives, on sys.path.
load_module(SCRIPT, "_towers_quality_script")
stats = importlib.import_module("_towers_quality.stats")
variants = importlib.import_module("_towers_quality.variants")
datasets = importlib.import_module("_towers_quality.datasets")


def test_the_paired_interval_is_the_t_interval_of_the_differences() -> None:
    """Differences 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.3027, half-width 4.3027 / sqrt(3)."""
    interval = stats.paired_interval([1.5, 2.0, 4.0], [0.5, 0.0, 1.0])
    assert interval.mean == pytest.approx(2.0)
    assert interval.sd == pytest.approx(1.0)
    half = 4.302653 / math.sqrt(3)
    assert (interval.low, interval.high) == pytest.approx((2.0 - half, 2.0 + half), rel=1e-6)
    assert not interval.keeps_accuracy
    near = stats.paired_interval([0.9, 0.9002, 0.8999, 0.9001], [0.9, 0.9, 0.9, 0.9])
    assert near.keeps_accuracy
    with pytest.raises(ValueError, match="two seeds"):
        stats.paired_interval([1.0], [1.0])


def test_the_random_partition_keeps_sizes_and_the_wire_ratio_counts_pairs() -> None:
    spec = ctr_spec({f"f{i}": 100 for i in range(10)}, num_dense_features=0, embedding_dim=16)
    dot = variants.BY_LABEL["dot r4 statistics-only"]
    towers = variants.towers_for(dot, spec, 512, None, seed=0)
    assert sorted(t for tower in towers for t in tower.tables) == sorted(spec.feature_names)
    shuffled = variants.shuffled(towers, seed=0)
    assert [len(t.tables) for t in shuffled] == [len(t.tables) for t in towers]
    assert [t.tables for t in shuffled] != [t.tables for t in towers]
    # Two towers of 5 tables of width 16 at ratio 4: 16 + 10 values each instead of 80.
    assert variants.wire_ratio(towers, spec) == pytest.approx(160 / 52)


@pytest.mark.skipif(
    bool(datasets.missing("movielens", DATA)), reason=f"MovieLens-1M files not in {DATA}"
)
def test_smoke_run_prints_tables_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bench = load_module(SCRIPT, "_towers_quality_script")
    out = tmp_path / "quality.json"
    argv = ["--smoke", "--datasets", "movielens", "--json", str(out), "--data-dir", str(DATA)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "95% interval" in printed and "learned - random" in printed
    doc = json.loads(out.read_text())
    aucs = doc["results"]["movielens"]["aucs"]
    assert set(aucs) == {"flat", "dot r4", "dot r4 random"}
    assert all(len(v) == 2 and all(0.0 < x < 1.0 for x in v) for v in aucs.values())
    assert set(doc["summary"]["movielens"]["dot r4"]) >= {"mean", "low", "high", "keeps_accuracy"}
    assert bench.main(["--smoke", "--datasets", "movielens", "--data-dir", str(tmp_path)]) == 2
