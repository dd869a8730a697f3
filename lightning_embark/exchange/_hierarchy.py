"""The process groups of a hierarchical exchange, and its cross-host stage.

A hierarchical all-to-all
(:class:`~lightning_embark.exchange._alltoall.HierarchicalAllToAll`, DMT towers' ID and
output hops) needs, per parent group, one group per host and one per local rank across
hosts (plus its twin, so that gloo carries each direction on its own connection).
``dist.new_group`` is collective and groups hold sockets, so they are made once per
process and parent group, cached here, and destroyed on request
(:func:`release_hierarchy_groups`); the cross-host stage itself (:func:`cross_host_rows`)
rides them. Kept apart from the exchange classes: group bookkeeping is process state, the
classes only route rows.

Every collective is called through the ``torch.distributed`` module attribute so that
:func:`lightning_embark.accounting.counting_collectives` sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.errors import ConfigError

# Keyed by the parent group object itself: after torch.distributed is torn down and
# initialised again, the new WORLD group is a new object, so destroyed groups are never reused.
# Values: (host group, same-local-rank group, its downward twin; see cross_host_rows).
_HIERARCHY_CACHE: dict[tuple[Any, int], tuple[Any, Any, Any]] = {}


def hierarchy_groups(ranks_per_host: int, group: Any = None) -> tuple[Any, Any]:
    """This rank's (host group, same-local-rank group), created once per process.

    ``dist.new_group`` must be called by every rank in the same order, so the first
    call for a given (group, ranks_per_host) must happen on all ranks at the same
    point of the program (module construction); later calls with the same parent group
    object hit the cache.
    """
    global_ranks = tuple(
        range(dist.get_world_size())
        if group is None or group is dist.GroupMember.WORLD
        else dist.get_process_group_ranks(group)
    )
    key = (group if group is not None else dist.GroupMember.WORLD, ranks_per_host)
    if key not in _HIERARCHY_CACHE:
        size = len(global_ranks)
        if ranks_per_host < 1 or size % ranks_per_host:
            raise ConfigError(
                f"ranks_per_host={ranks_per_host} must divide the group size {size} for a "
                "hierarchical exchange"
            )
        hosts = size // ranks_per_host
        me = global_ranks.index(dist.get_rank())
        host_group = local_group = down_group = None
        for host in range(hosts):
            ranks = [
                global_ranks[host * ranks_per_host + local] for local in range(ranks_per_host)
            ]
            made = dist.new_group(ranks)
            if host == me // ranks_per_host:
                host_group = made
        for twin in range(2):  # the same-local-rank groups, then their downward twins
            for local in range(ranks_per_host):
                ranks = [global_ranks[host * ranks_per_host + local] for host in range(hosts)]
                made = dist.new_group(ranks)
                if local == me % ranks_per_host:
                    if twin:
                        down_group = made
                    else:
                        local_group = made
        _HIERARCHY_CACHE[key] = (host_group, local_group, down_group)
    host_group, local_group, _ = _HIERARCHY_CACHE[key]
    return host_group, local_group


def cross_host_rows(
    send: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    ranks_per_host: int,
    group: Any = None,
) -> torch.Tensor:
    """One all-to-all of rows among this rank's same-local-rank peers, one per host.

    ``send_counts[h]`` rows go to (and ``recv_counts[h]`` come from) the rank of host
    ``h`` with this rank's local rank; positions are hosts, as in the same-local-rank
    group of :func:`hierarchy_groups`, which must have been made (every rank at the same
    point) before.

    Under gloo each direction takes its own connection: rows to higher hosts (and to
    this rank itself) on the same-local-rank group, rows to lower hosts on its twin, as
    two concurrent collectives. A gloo group has one TCP connection per pair of ranks,
    and one connection carrying a full exchange both ways reached half the shaped link's
    rate per direction on the emulated cluster, where one direction per connection
    reached it (docs/benchmarks.md#exchange-efficiency: 4 MB per rank both ways over 2
    connections 132 ms, one way 86 ms; with this and the overlap of
    :meth:`~lightning_embark.exchange._alltoall.HierarchicalAllToAll._overlapped`, an
    RB-like hierarchical exchange of 8 MB per rank went from 0.50 to 0.90 of the measured
    line rate). Other backends take one collective.
    """
    out, works = start_cross_host(send, send_counts, recv_counts, ranks_per_host, group)
    for work in works:
        work.wait()
    return out


def start_cross_host(
    send: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    ranks_per_host: int,
    group: Any,
) -> tuple[torch.Tensor, list[Any]]:
    """:func:`cross_host_rows` started: the output (valid once every work has waited)."""
    key = (group if group is not None else dist.GroupMember.WORLD, ranks_per_host)
    if key not in _HIERARCHY_CACHE:
        hierarchy_groups(ranks_per_host, group)
    _, up_group, down_group = _HIERARCHY_CACHE[key]
    send_counts = [int(c) for c in send_counts]
    recv_counts = [int(c) for c in recv_counts]
    hosts = len(send_counts)
    me = dist.get_rank(up_group)
    send = send.contiguous()
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    if dist.get_backend(up_group) != "gloo" or hosts < 2:
        work = dist.all_to_all_single(
            out, send, recv_counts, send_counts, group=up_group, async_op=True
        )
        return out, [work]
    # Rows are in host order: to lower hosts first (down), then self and higher (up);
    # received in host order likewise: from self and lower (up), then from higher (down).
    low_send = sum(send_counts[:me])
    low_recv = sum(recv_counts[: me + 1])
    up = [0] * me + send_counts[me:]
    up_recv = recv_counts[: me + 1] + [0] * (hosts - me - 1)
    down = send_counts[:me] + [0] * (hosts - me)
    down_recv = [0] * (me + 1) + recv_counts[me + 1 :]
    works = [
        dist.all_to_all_single(
            out[:low_recv], send[low_send:], up_recv, up, group=up_group, async_op=True
        ),
        dist.all_to_all_single(
            out[low_recv:], send[:low_send], down_recv, down, group=down_group, async_op=True
        ),
    ]
    return out, works


def release_hierarchy_groups(group: Any) -> None:
    """Destroy the host and same-local-rank groups made under ``group`` and forget them.

    For a process that builds one sharded model after another (each with its own parent
    group): every gloo group holds sockets to its peers, so groups left behind add up.
    Every rank calls it at the same point, as it called :func:`hierarchy_groups`.
    """
    for key in [k for k in _HIERARCHY_CACHE if k[0] is group]:
        for made in _HIERARCHY_CACHE.pop(key):
            if made is not None:
                dist.destroy_process_group(made)
