"""Variable-size all-to-all of rows: the one collective every embedding cluster rides.

An exchange moves a tensor whose rows are ordered by destination rank and returns
the rows received, ordered by source rank. Embedding clusters send IDs, codec
payloads (uint8 rows) and gradients through it, so a cluster's wire format never
depends on how the bytes travel. Two implementations share one call signature:

* :class:`FlatAllToAll` - one ``all_to_all_single`` on the cluster's group.
* :class:`HierarchicalAllToAll` - an intra-host stage (to the peer on this host with
  the destination's local rank) then a cross-host stage among ranks with the same
  local rank. Cross-host traffic then flows only between same-local-rank peers, as
  a rail-optimised network wants; DMT towers reuse it for their ID and output hops.

Its process groups (one per host, one per local rank across hosts) and the cross-host
stage live in :mod:`~lightning_embark.exchange._hierarchy`.

Every collective is called through the ``torch.distributed`` module attribute so
that :func:`lightning_embark.accounting.counting_collectives` sees it.

Device: received rows and the counts swapped between ranks are made on the device of
the rows sent (the collectives need CPU tensors under gloo and CUDA tensors under NCCL);
the counts then come to the host once, as the Python split sizes the collectives take.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark._host_work import to_device
from lightning_embark.errors import ConfigError
from lightning_embark.exchange._hierarchy import (
    cross_host_rows,
    hierarchy_groups,
    start_cross_host,
)

_COUNT_DTYPE = torch.int64


class AllToAll(ABC):
    """A variable-size all-to-all over the ranks of one process group.

    Ranks are positions in the group (``0 .. size - 1``), which equal global ranks
    for the default group.
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    @abstractmethod
    def __call__(
        self,
        send: torch.Tensor,
        send_counts: Sequence[int],
        recv_counts: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Send ``send_counts[p]`` rows of ``send`` (in destination order) to rank ``p``.

        Args:
            send: Rows ordered by destination, split along dim 0.
            send_counts: Rows for each destination; sums to ``send.shape[0]``.
            recv_counts: Rows expected from each source when the caller knows them
                (saves a counts exchange); None to exchange counts first.

        Returns:
            The received rows ordered by source rank, and the rows from each source.
        """


def _check_counts(counts: Sequence[int], size: int, what: str) -> list[int]:
    counts = [int(c) for c in counts]
    if len(counts) != size or any(c < 0 for c in counts):
        raise ConfigError(f"{what} must be {size} non-negative row counts, got {counts}")
    return counts


def _check_send(send: torch.Tensor, send_counts: Sequence[int], size: int) -> list[int]:
    counts = _check_counts(send_counts, size, "send_counts")
    if sum(counts) != send.shape[0]:
        raise ConfigError(f"send_counts sum to {sum(counts)} but {send.shape[0]} rows are given")
    return counts


def all_to_all_rows(
    send: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: Any
) -> torch.Tensor:
    """One ``all_to_all_single`` of rows with known counts on ``group`` (group ranks)."""
    out = send.new_empty((sum(recv_counts), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts, group=group)
    return out


def _exchange_counts(
    counts: Sequence[int], per_peer: int, group: Any, device: torch.device
) -> list[int]:
    """Swap ``per_peer`` counts with every group peer (row-major by peer).

    The counts travel as int64 on ``device`` (the device of the rows they describe, which
    the group's backend takes) and come back to the host in one copy. A group of one (a
    host with one rank) swaps with itself: the counts are returned as they are, with no
    collective and no host copy.
    """
    size = dist.get_world_size(group)
    if size == 1:
        return [int(c) for c in counts]
    send = to_device(list(counts), dtype=_COUNT_DTYPE, device=device)
    out = torch.empty(size * per_peer, dtype=_COUNT_DTYPE, device=device)
    dist.all_to_all_single(out, send, group=group)
    return out.tolist()


class FlatAllToAll(AllToAll):
    """One ``all_to_all_single`` (plus one for counts when they are not known)."""

    def __call__(
        self,
        send: torch.Tensor,
        send_counts: Sequence[int],
        recv_counts: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        send_counts = _check_send(send, send_counts, self.size)
        if recv_counts is None:
            recv_counts = _exchange_counts(send_counts, 1, self.group, send.device)
        recv_counts = _check_counts(recv_counts, self.size, "recv_counts")
        return all_to_all_rows(send, send_counts, recv_counts, self.group), recv_counts


class HierarchicalAllToAll(AllToAll):
    """Two-stage all-to-all: inside the host first, then across hosts.

    Rank ``h * L + l`` (host ``h``, local rank ``l``) sends everything destined to
    local rank ``l'`` of any host to its own host's rank ``l'`` (stage 1, fast links),
    which forwards each host's share to rank ``l'`` of that host (stage 2, among
    same-local-rank peers, :func:`cross_host_rows`: each direction on its own gloo
    connection). Bytes crossing hosts are the same as a flat exchange, but only
    between same-local-rank peers: to ``H - 1`` peers per rank instead of ``(H - 1) * L``.

    With ``recv_counts`` given (every engine exchange gives them), a rank's own rows for
    its same-local-rank peers cross hosts while stage 1 runs (:meth:`_overlapped`): two
    cross-host messages per remote peer, and the link busy during the intra-host stage.

    Stage 1 always swaps ``H`` counts per intra-host peer (the forwarder must know
    how to split); stage 2 swaps ``L`` counts per cross-host peer only when the
    caller does not give ``recv_counts``.

    Args:
        ranks_per_host: ``L``; must divide the group size.
        group: The process group (default: world).
    """

    def __init__(self, ranks_per_host: int, group: Any = None) -> None:
        super().__init__(group)
        self.ranks_per_host = ranks_per_host
        self.num_hosts = self.size // ranks_per_host
        self.host_group, self.local_group = hierarchy_groups(ranks_per_host, group)
        self.host = self.rank // ranks_per_host
        self.local = self.rank % ranks_per_host

    def __call__(
        self,
        send: torch.Tensor,
        send_counts: Sequence[int],
        recv_counts: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        hosts, local = self.num_hosts, self.ranks_per_host
        send_counts = _check_send(send, send_counts, self.size)
        if recv_counts is not None and local > 1:
            recv_counts = _check_counts(recv_counts, self.size, "recv_counts")
            return self._overlapped(send, send_counts, recv_counts), recv_counts
        device = send.device
        # Counts stay Python ints (r: a local rank): [h', r'] is send_counts[h' * L + r'].
        # Stage 1: regroup rows by destination local rank (then host), send inside the host.
        stage1 = _regroup(send, send_counts, hosts, local)
        split1 = [sum(send_counts[h * local + r] for h in range(hosts)) for r in range(local)]
        # To intra-host peer r': my counts for (h', r') over h'; back, per source r: [r][h'].
        counts1 = _exchange_counts(
            [send_counts[h * local + r] for r in range(local) for h in range(hosts)],
            hosts,
            self.host_group,
            device,
        )
        stage2, split2 = self._forward_inside_host(stage1, split1, counts1)
        if recv_counts is None:
            # To host h': counts1[r][h'] over r; back: [source host, source local], which
            # is global source order.
            recv_counts = _exchange_counts(
                [counts1[r * hosts + h] for h in range(hosts) for r in range(local)],
                local,
                self.local_group,
                device,
            )
        recv_counts = _check_counts(recv_counts, self.size, "recv_counts")
        per_host = [sum(recv_counts[h * local : (h + 1) * local]) for h in range(hosts)]
        received = cross_host_rows(stage2, split2, per_host, local, self.group)
        return received, recv_counts

    def _forward_inside_host(
        self, stage1: torch.Tensor, split1: list[int], counts1: list[int]
    ) -> tuple[torch.Tensor, list[int]]:
        """Stage 1 (to each intra-host peer ``r'``, ``split1[r']`` rows; ``counts1[r][h']``:
        what local source ``r`` has for host ``h'`` with this rank's local rank), then the
        rows regrouped for stage 2: per destination host, every local source's rows in
        source order, and their counts per host."""
        hosts, local = self.num_hosts, self.ranks_per_host
        recv1 = all_to_all_rows(
            stage1,
            split1,
            [sum(counts1[r * hosts : (r + 1) * hosts]) for r in range(local)],
            self.host_group,
        )
        stage2 = _regroup(recv1, counts1, local, hosts)
        split2 = [sum(counts1[r * hosts + h] for r in range(local)) for h in range(hosts)]
        return stage2, split2

    def _overlapped(
        self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]
    ) -> torch.Tensor:
        """The exchange with known receive counts: this rank's own rows for its
        same-local-rank peers cross hosts while the intra-host stage runs.

        Rows for ``(h', l)`` (``l``: this rank's local rank) need no forwarder, so they
        start across hosts first (asynchronously); stage 1 then moves only the rows for
        the other local ranks, and stage 2 forwards those. The cross-host link is busy
        during stage 1 instead of idle (docs/benchmarks.md#exchange-efficiency). The
        received rows are put back into global source order with one copy.
        """
        hosts, local, me = self.num_hosts, self.ranks_per_host, self.local
        device = send.device
        chunks = send.split(send_counts)
        direct_recv = [recv_counts[h * local + me] for h in range(hosts)]
        direct, direct_works = start_cross_host(
            _cat([chunks[h * local + me] for h in range(hosts)], send),
            [send_counts[h * local + me] for h in range(hosts)],
            direct_recv,
            local,
            self.group,
        )
        # Stage 1, without this rank's own local rank: to intra-host peer r' its rows for
        # (h', r') over h'; back, per source r, [r][h'] (zeros from itself).
        others = [r for r in range(local) if r != me]
        stage1 = _cat([chunks[h * local + r] for r in others for h in range(hosts)], send)
        counts1 = _exchange_counts(
            [
                0 if r == me else send_counts[h * local + r]
                for r in range(local)
                for h in range(hosts)
            ],
            hosts,
            self.host_group,
            device,
        )
        split1 = [
            0 if r == me else sum(send_counts[h * local + r] for h in range(hosts))
            for r in range(local)
        ]
        # Stage 2: per destination host, the forwarded rows of the other local sources.
        stage2, split2 = self._forward_inside_host(stage1, split1, counts1)
        forwarded_recv = [sum(recv_counts[h * local + r] for r in others) for h in range(hosts)]
        forwarded = cross_host_rows(stage2, split2, forwarded_recv, local, self.group)
        for work in direct_works:
            work.wait()
        # Global source order [source host, source local]: own local rank from the
        # direct rows, the others from the forwarded ones (in source-local order).
        direct_parts = direct.split(direct_recv)
        forwarded_parts = iter(
            forwarded.split([recv_counts[h * local + r] for h in range(hosts) for r in others])
        )
        return _cat(
            [
                direct_parts[h] if r == me else next(forwarded_parts)
                for h in range(hosts)
                for r in range(local)
            ],
            send,
        )


def _cat(chunks: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``chunks`` concatenated along rows (an empty tensor shaped like ``like``'s rows
    when there are none)."""
    return torch.cat(chunks) if chunks else like.new_empty((0, *like.shape[1:]))


def _regroup(rows: torch.Tensor, counts: Sequence[int], outer: int, inner: int) -> torch.Tensor:
    """``rows``, in runs of ``counts`` ordered ``(outer, inner)``, reordered ``(inner, outer)``.

    Concatenates views: one copy, where an index gather of narrow byte rows costs ~10x
    more on CPUs.
    """
    if outer == 1 or inner == 1:
        return rows
    chunks = rows.split(list(counts))
    return torch.cat([chunks[o * inner + i] for i in range(inner) for o in range(outer)])


def make_exchange(*, hierarchical: bool, ranks_per_host: int, group: Any = None) -> AllToAll:
    """The exchange a cluster asked for; a one-host world needs no hierarchy."""
    size = dist.get_world_size(group)
    if hierarchical and ranks_per_host < size:
        return HierarchicalAllToAll(ranks_per_host, group)
    return FlatAllToAll(group)
