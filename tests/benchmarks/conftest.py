"""Fixtures shared by the benchmark scripts' tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

#: One strategy's record in an ``embark-bench`` result, as the headline suite reads it.
HeadlineRun = Callable[..., dict[str, Any]]


@pytest.fixture
def headline_run() -> HeadlineRun:
    """A fake ``embark-bench`` run: its median step, exchange share and inter-host bytes
    (embedding and dense), with the fields the headline suite aggregates."""

    def run(
        step_ms: float, share: float = 0.3, emb: int = 2_000_000, dense: int = 3_000_000
    ) -> dict[str, Any]:
        return {
            "step_time_ms": {"median": step_ms, "p10": step_ms, "p90": step_ms},
            "comm_share": share,
            "bytes_per_step": {
                "inter_host": emb + dense,
                "embedding_inter_host": emb,
                "by_traffic": {"dense": {"inter_host": dense, "intra_host": 0, "calls": 1}},
            },
            "dense_compression": "fp32",
            "dense_exchange": "flat",
        }

    return run
