"""Timing helpers of the probes: host groups, size labels, the slowest rank's median."""

from __future__ import annotations

import time

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
    """Outside a process group the slowest rank is this one: the median of its repeats,
    each read on ``clock`` around one call (warm-up calls unread). A clock that steps by
    known amounts gives the exact median."""
    calls: list[int] = []
    readings = iter([10.0, 11.0, 20.0, 25.0, 30.0, 32.0])  # repeats of 1, 5 and 2 s
    seconds = time_repeats(
        lambda: calls.append(1), repeats=3, warmup=2, clock=lambda: next(readings)
    )
    assert len(calls) == 5 and seconds == 2.0
    assert next(readings, None) is None  # two readings per repeat, none per warm-up call


def test_timed_measures_a_known_sleep() -> None:
    """``timed`` of a 20 ms sleep is at least 20 ms less the clock's resolution (a sleep
    never ends early; the two readings can each be off by one tick), and well below a
    second: a loaded machine delays a wake-up by milliseconds, while a reading in other
    units (ms: 20) or of the wrong interval (0, or the time since an epoch) misses."""
    sleep = 0.02
    resolution = time.get_clock_info("perf_counter").resolution
    seconds = timed(lambda: time.sleep(sleep))
    assert sleep - 2 * resolution <= seconds < sleep + 0.5
    readings = iter([5.0, 7.5])
    assert timed(lambda: None, clock=lambda: next(readings)) == 2.5
