"""``benchmarks/_headline/runs.py``: a run's plan summary condensed to a count per layout,
and the towers a tower row's plan has."""

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


def test_tower_use_reads_the_plan() -> None:
    """A tower row reports the towers its plan has: none (a flat plan), or their count,
    modules and tables, with the planner's choice where the plan records one."""
    assert runs.tower_use(None) == {"known": False, "count": 0, "modules": [], "tables": 0}
    flat = {"world_size": 4, "towers": []}
    assert runs.tower_use(flat) == {"known": True, "count": 0, "modules": [], "tables": 0}
    plan = {
        "towers": [
            {"name": "t0", "host": 0, "tables": ["a", "b"], "module": "identity"},
            {"name": "t1", "host": 1, "tables": ["c"], "module": "projection"},
        ],
        "tower_choice": {"chosen": "2 towers", "reason": "cheapest", "candidates": []},
    }
    assert runs.tower_use(plan) == {
        "known": True,
        "count": 2,
        "modules": ["identity", "projection"],
        "tables": 3,
        "choice": "2 towers",
        "reason": "cheapest",
    }
