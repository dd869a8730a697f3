"""Link probes: all-to-alls inside each host and across hosts, whole hierarchical
exchanges and a ring all-reduce, at several per-peer message sizes.

The groups of one link class run at once (every host's intra-host group together, every
local rank's inter-host group together), so ranks contend for links and cores as they do
in an exchange.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

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
) -> dict | None:
    """Per-peer all-to-all times in the group (of ``groups``) this rank belongs to."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    handles = [
        dist.new_group(ranks=g, backend="gloo") for g in groups
    ]  # every rank creates every group
    n = len(groups[0])
    if n < 2:
        return None
    mine = next(h for g, h in zip(groups, handles, strict=False) if rank in g)
    seconds = []
    for size in sizes:
        numel = max(1, size // 4)
        send = torch.ones(n * numel, dtype=torch.float32)
        recv = torch.empty_like(send)
        t = time_repeats(
            functools.partial(dist.all_to_all_single, recv, send, group=mine), repeats=repeats
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
    sizes: Sequence[int], ranks_per_host: int, *, repeats: int, progress: Callable[[str], None]
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
        send = torch.ones(world * numel, 1, dtype=torch.float32)
        counts = [numel] * world
        t = time_repeats(functools.partial(exchange, send, counts, counts), repeats=repeats)
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
    sizes: Sequence[int], *, repeats: int, progress: Callable[[str], None]
) -> dict | None:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if world < 2:
        return None
    seconds = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        t = time_repeats(functools.partial(dist.all_reduce, x), repeats=repeats)
        seconds.append(t)
        progress(f"all-reduce over {world} ranks: {size_label(size)} {1e3 * t:.2f} ms")
    return {"sizes": [max(1, s // 4) * 4 for s in sizes], "seconds": seconds, "world": world}
