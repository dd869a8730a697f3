"""Timing helpers of the probes: a collective's time is the slowest rank's, the median
over repeats (every rank of the group calls), and the rank groups of a host layout.

Every helper reads its clock through ``clock`` (default ``time.perf_counter``): on CUDA
the probes pass :func:`~lightning_embark.calibration._device.timer`'s clock, which waits
for the device first, since kernels and NCCL collectives return before they finish."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from lightning_embark.errors import ConfigError


def slowest_median(times: list[float], group: Any = None, *, device: Any = "cpu") -> float:
    """Median over repeats of the slowest rank's time (all ranks of ``group`` call).

    ``device`` is where the times travel: the backend's device (NCCL reduces CUDA
    tensors only)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(statistics.median(t.tolist()))


def time_repeats(
    fn: Callable[[], Any],
    *,
    repeats: int,
    warmup: int = 1,
    group: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    device: Any = "cpu",
) -> float:
    """Seconds of ``fn()``: median over ``repeats`` of the slowest rank (barrier before each).

    ``clock`` is read before and after every call (a device-synchronizing clock on
    CUDA); ``device`` is where the times are reduced (:func:`slowest_median`)."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if dist.is_initialized():
            dist.barrier(group=group)
        start = clock()
        fn()
        times.append(clock() - start)
    return slowest_median(times, group, device=device)


def host_groups(world: int, ranks_per_host: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rank lists: one per host (intra-host), one per local rank across hosts (inter-host)."""
    if ranks_per_host < 1 or world % ranks_per_host:
        raise ConfigError(f"ranks_per_host={ranks_per_host} must divide the world size {world}")
    hosts = world // ranks_per_host
    intra = [list(range(h * ranks_per_host, (h + 1) * ranks_per_host)) for h in range(hosts)]
    inter = [[h * ranks_per_host + j for h in range(hosts)] for j in range(ranks_per_host)]
    return intra, inter


def timed(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one call of ``fn`` on this rank alone, read with ``clock``."""
    start = clock()
    fn()
    return clock() - start


def size_label(n: float) -> str:
    """``n`` bytes for a progress line: ``4 KiB``, ``1 MiB``, ``12 B``."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"
