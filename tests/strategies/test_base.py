"""The sharding strategies' base: a plan of many tables prints every cluster, a few tables
each; Lightning's collectives settle the work in flight first."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_embark.strategies._base import ShardingStrategy, concise_summary


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


class _Recorded(ShardingStrategy):
    """A sharding strategy whose settle and Lightning collectives only record the order."""

    strategy_name = "recorded"

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    @property
    def plan(self) -> Any:
        return None

    def format_plan(self, plan: Any) -> str:
        return ""

    def settle(self) -> None:
        self.calls.append("settle")


def test_lightnings_collectives_settle_the_work_in_flight_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank must not wait in Lightning's barrier (or reduce, broadcast, all-gather) while
    its engines' work from the last step is failing or waits for a peer that waits for it
    there: each settles first, then runs DDP's collective."""
    calls: list[str] = []
    for name in ("barrier", "broadcast", "reduce", "all_gather"):
        monkeypatch.setattr(
            DDPStrategy, name, lambda self, *a, _name=name, **k: calls.append(_name)
        )
    strategy = _Recorded(calls)
    strategy.barrier()
    strategy.broadcast(1)
    strategy.reduce(torch.ones(1))
    strategy.all_gather(torch.ones(1))
    assert calls == [
        "settle",
        "barrier",
        "settle",
        "broadcast",
        "settle",
        "reduce",
        "settle",
        "all_gather",
    ]
