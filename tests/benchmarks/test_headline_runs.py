"""``benchmarks/_headline/runs.py``: a run's plan summary condensed to a count per layout."""

from __future__ import annotations

import importlib
from pathlib import Path

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
runs = importlib.import_module("_headline.runs")


def test_condense_plan_summary_counts_layouts() -> None:
    text = (
        "topology emulated: 2 host(s) x 2 rank(s)\n"
        "model.sparse_arch.embedding_bag_collection:\n"
        "  t_t0: table_row_wise (fused) ranks=[0, 1]\n"
        "  t_t1: table_row_wise (fused) ranks=[2, 3]\n"
        "  t_t2: data_parallel (dense) ranks=[0, 1, 2, 3]\n"
    )
    assert runs.condense_plan_summary(text) == [
        "topology emulated: 2 host(s) x 2 rank(s)",
        "model.sparse_arch.embedding_bag_collection:",
        "table_row_wise (fused) x 2",
        "data_parallel (dense) x 1",
    ]
