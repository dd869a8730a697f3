"""``benchmarks/_headline/workloads.py``: one width for a mixed-width spec, and the bench's
model argument: the preset where its tables share a width, else a one-width copy."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
headline_workloads = importlib.import_module("_headline.workloads")


def test_uniform_width() -> None:
    t180 = [128] * 96 + [64] * 65 + [32] * 6 + [256] * 10  # mean 108.5 -> 112
    assert headline_workloads.uniform_width(t180) == 112
    assert headline_workloads.uniform_width([32, 64]) == 48


def test_spec_for_bench_rewrites_only_mixed_widths(tmp_path: Path) -> None:
    workloads = {w.key: w for w in headline_workloads.WORKLOADS}
    assert headline_workloads.spec_for_bench(workloads["t200"], tmp_path) == (
        "hugectr-200table-100B-hotness20",
        128,
    )
    path, width = headline_workloads.spec_for_bench(workloads["t180"], tmp_path)
    spec = json.loads(Path(path).read_text())
    assert width == 112 and {t["embedding_dim"] for t in spec["tables"]} == {112}
    assert len(spec["tables"]) == 177 and spec["name"].endswith("-w112")


def test_strategy_rows_and_references() -> None:
    """The rows a user compares: torchrec's own planner and its fp16 qcomms as references,
    the paper's baseline, and the three embark rows, each judged against the torchrec
    configuration it replaces; the tower row leaves the towers to the planner."""
    runs = headline_workloads.STRATEGY_RUNS
    assert list(runs) == [
        "torchrec",
        "torchrec-fp16",
        "torchrec-twrw",
        "embark",
        "embark-compressed",
        "embark-towers-compressed",
    ]
    towers = runs["embark-towers-compressed"]
    assert (towers.strategy, towers.compressed, towers.towers) == ("embark-towers", True, "auto")
    assert runs["embark-compressed"].compressed and not runs["embark"].compressed
    assert all(r.towers is None for k, r in runs.items() if k != "embark-towers-compressed")
    assert headline_workloads.REFERENCES == {
        "embark": "torchrec",
        "embark-compressed": "torchrec-fp16",
        "embark-towers-compressed": "torchrec-fp16",
    }
    # Every run is a strategy the bench knows.
    from lightning_embark.harness import KNOWN_STRATEGIES

    assert {r.strategy for r in runs.values()} <= set(KNOWN_STRATEGIES)
    regimes = [w.regime for w in headline_workloads.WORKLOADS]
    assert regimes.count("compute-bound") == 1 and regimes.count("comm-bound") == 4
