"""Link probes: all-to-alls inside each host and across hosts, whole hierarchical
exchanges and a ring all-reduce, at several per-peer message sizes.

The groups of one link class run at once (every host's intra-host group together, every
local rank's inter-host group together), so ranks contend for links and cores as they do
in an exchange.

Every probe takes the ``device`` it measures on (default the CPU): its tensors live there,
its subgroups use that device's backend (:func:`~lightning_embark.calibration._device.
probe_backend`: gloo or NCCL, as the engine's), and its clock waits for the device
(:func:`~lightning_embark.calibration._device.timer`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from lightning_embark.calibration._device import probe_backend, timer
from lightning_embark.calibration._timing import size_label, time_repeats

#: Default per-peer message sizes in bytes: 4 KiB .. 4 MiB.
DEFAULT_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)


def alltoall_series(
    sizes: Sequence[int],
    groups: list[list[int]],
    *,
    repeats: int,
    progress: Callable[[str], None],
    label: str,
    device: Any = "cpu",
) -> dict | None:
    """Per-peer all-to-all times in the group (of ``groups``) this rank belongs to."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    backend = probe_backend(device)
    handles = [
        dist.new_group(ranks=g, backend=backend) for g in groups
    ]  # every rank creates every group
    n = len(groups[0])
    if n < 2:
        return None
    mine = next(h for g, h in zip(groups, handles, strict=False) if rank in g)
    seconds = []
    for size in sizes:
        numel = max(1, size // 4)
        send = torch.ones(n * numel, dtype=torch.float32, device=device)
        recv = torch.empty_like(send)
        t = time_repeats(
            functools.partial(dist.all_to_all_single, recv, send, group=mine),
            repeats=repeats,
            clock=timer(device),
            device=device,
        )
        seconds.append(t / (n - 1))
        progress(
            f"{label} all-to-all, {len(groups)} group(s) of {n}: {size_label(size)} per peer "
            f"{1e3 * t:.2f} ms ({numel * 4 / (t / (n - 1)) / 1e6:.1f} MB/s per rank)"
        )
    return {
        "sizes": [max(1, s // 4) * 4 for s in sizes],
        "seconds_per_peer": seconds,
        "group_size": n,
        "groups": len(groups),
    }


def hierarchical_series(
    sizes: Sequence[int],
    ranks_per_host: int,
    *,
    repeats: int,
    progress: Callable[[str], None],
    device: Any = "cpu",
) -> dict | None:
    """Whole hierarchical exchanges over the world, ``size`` bytes to every peer (counts
    known, as for the engine's row payloads); None on one host or one rank per host."""
    import torch
    import torch.distributed as dist

    from lightning_embark.exchange import HierarchicalAllToAll

    world = dist.get_world_size()
    if ranks_per_host < 2 or world <= ranks_per_host:
        return None
    exchange = HierarchicalAllToAll(ranks_per_host)  # every rank creates the same groups
    seconds = []
    for size in sizes:
        numel = max(1, size // 4)
        send = torch.ones(world * numel, 1, dtype=torch.float32, device=device)
        counts = [numel] * world
        t = time_repeats(
            functools.partial(exchange, send, counts, counts),
            repeats=repeats,
            clock=timer(device),
            device=device,
        )
        seconds.append(t)
        progress(
            f"hierarchical all-to-all over {world} ranks: {size_label(size)} per peer "
            f"{1e3 * t:.2f} ms"
        )
    return {
        "sizes": [max(1, s // 4) * 4 for s in sizes],
        "seconds": seconds,
        "world": world,
        "ranks_per_host": ranks_per_host,
    }


def allreduce_series(
    sizes: Sequence[int], *, repeats: int, progress: Callable[[str], None], device: Any = "cpu"
) -> dict | None:
    """Ring all-reduce times over the world at each size (None on one rank)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if world < 2:
        return None
    seconds = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        t = time_repeats(
            functools.partial(dist.all_reduce, x),
            repeats=repeats,
            clock=timer(device),
            device=device,
        )
        seconds.append(t)
        progress(f"all-reduce over {world} ranks: {size_label(size)} {1e3 * t:.2f} ms")
    return {"sizes": [max(1, s // 4) * 4 for s in sizes], "seconds": seconds, "world": world}
