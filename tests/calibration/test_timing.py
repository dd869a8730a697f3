"""Timing helpers of the probes: host groups, size labels, the slowest rank's median."""

from __future__ import annotations

import pytest

from lightning_embark.calibration._timing import host_groups, size_label, time_repeats, timed
from lightning_embark.errors import ConfigError


def test_host_groups() -> None:
    assert host_groups(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ConfigError, match="must divide"):
        host_groups(4, 3)


def test_size_label_uses_binary_units() -> None:
    assert [size_label(n) for n in (12, 4096, 1 << 20, 1536)] == [
        "12 B",
        "4 KiB",
        "1 MiB",
        "1.5 KiB",
    ]


def test_time_repeats_without_a_process_group_runs_warmup_then_repeats() -> None:
    """Outside a process group the slowest rank is this one: the median of its repeats."""
    calls: list[int] = []
    seconds = time_repeats(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and seconds >= 0
    assert timed(lambda: None) >= 0
