"""Fixtures shared by the benchmark scripts' tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

#: One strategy's record in an ``embark-bench`` result, as the headline suite reads it.
HeadlineRun = Callable[..., dict[str, Any]]


@pytest.fixture
def headline_run() -> HeadlineRun:
    """A fake ``embark-bench`` run: its median step (p10 and p90 around it: ``spread`` is
    the run's p90 / p10), exchange share, CPU per rank and inter-host bytes (embedding and
    dense), with the fields the headline suite aggregates."""

    def run(
        step_ms: float,
        share: float = 0.3,
        emb: int = 2_000_000,
        dense: int = 3_000_000,
        spread: float = 1.0,
        cpu_ms: float | None = 50.0,
    ) -> dict[str, Any]:
        return {
            "step_time_ms": {"median": step_ms, "p10": step_ms, "p90": step_ms * spread},
            "comm_share": share,
            "cpu_ms_per_rank": cpu_ms,
            "bytes_per_step": {
                "inter_host": emb + dense,
                "embedding_inter_host": emb,
                "by_traffic": {"dense": {"inter_host": dense, "intra_host": 0, "calls": 1}},
            },
            "dense_compression": "fp32",
            "dense_exchange": "flat",
            "cluster_mode": "netns",
        }

    return run
