"""concise_summary: a plan of many tables prints every cluster, a few tables each."""

from __future__ import annotations

from lightning_embark.strategies._base import concise_summary


def test_short_summaries_are_whole_and_long_ones_keep_every_header() -> None:
    short = "plan: 2 ranks\ncluster a: 1 table(s)\n  f0: RB"
    assert concise_summary(short) == short
    tables = [f"  t{i}: RB" for i in range(50)]
    long = "\n".join(["plan: 4 ranks", "cluster a: 50 table(s)", *tables, "cluster b: 0 table(s)"])
    assert concise_summary(long, per_group=2).splitlines() == [
        "plan: 4 ranks",
        "cluster a: 50 table(s)",
        "  t0: RB",
        "  t1: RB",
        "  ... 48 more",
        "cluster b: 0 table(s)",
        "(53 lines in all: trainer.strategy.plan_summary())",
    ]
