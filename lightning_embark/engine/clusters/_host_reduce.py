"""RB's hierarchical rows exchange: partial sums reduced inside the owners' host first.

A reduction-based table split by rows returns one partial sum per row shard; a plain
exchange (flat or :class:`HierarchicalAllToAll`) carries every partial across hosts.
Here the owners of host ``h`` send their partials for requester ``q`` to ``h``'s
rank with ``q``'s local rank (stage 1, fast links); that forwarder adds the partials
of the same feature and column shard and sends one vector per key across hosts to
``q`` (stage 2, among same-local-rank peers). Cross-host bytes for a table split
over the ``L`` ranks of a host drop by ``L``. Backward mirrors it: the requester
sends each host one gradient slice per key, and the forwarder copies it to every
row-shard owner of that key on its host.

All sizes follow from the plan and the batch sizes every rank learns from the
cluster's header, so no counts travel. A forwarder decodes, adds (in owner rank
order) and re-encodes only keys with several partials, all of them in one
unpack-reduce and one pack; a lone partial is forwarded as it came.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from lightning_embark.engine._routing import ClusterRoutes, Request
from lightning_embark.exchange import all_to_all_rows, cross_host_rows, hierarchy_groups
from lightning_embark.kernels import (
    ExchangeLayout,
    RankSlice,
    decode_rows,
    pack,
    unpack_reduce,
)
from lightning_embark.wire import Codec

Key = tuple[int, int]  # (slot, column shard)


def reduce_keys(
    routes: ClusterRoutes, requester: int, host: int, ranks_per_host: int
) -> list[tuple[Key, Request]]:
    """Keys ``requester`` reads from ``host``'s owners, sorted, each with a representative
    request."""
    found: dict[Key, Request] = {}
    for owner in range(host * ranks_per_host, (host + 1) * ranks_per_host):
        for request in routes.requests(requester, owner):
            found.setdefault((request.slot, request.block.col_shard), request)
    return sorted(found.items(), key=lambda kv: kv[0])


class HostReduce:
    """Static routing of the reduced exchange for one RB cluster on one rank.

    Args:
        routes: The cluster's routing.
        rank: This rank (in the cluster's group).
        ranks_per_host: ``L``.
        group: The cluster's process group.
        device: The cluster's device (where its buffers live, empty ones included).
    """

    def __init__(
        self,
        routes: ClusterRoutes,
        rank: int,
        ranks_per_host: int,
        group: Any = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        self.routes = routes
        self.device = torch.device(device)
        self.rank = rank
        self.local_size = ranks_per_host
        self.hosts = routes.world_size // ranks_per_host
        self.host, self.local = divmod(rank, ranks_per_host)
        self.host_group, self.local_group = hierarchy_groups(ranks_per_host, group)
        self.group = group
        self._keys: dict[tuple[int, int], list[tuple[Key, Request]]] = {}

    def keys(self, requester: int, host: int) -> list[tuple[Key, Request]]:
        """:func:`reduce_keys`, cached."""
        if (requester, host) not in self._keys:
            self._keys[(requester, host)] = reduce_keys(
                self.routes, requester, host, self.local_size
            )
        return self._keys[(requester, host)]

    def owners_on(self, host: int) -> range:
        return range(host * self.local_size, (host + 1) * self.local_size)

    def requesters_of(self, local: int) -> list[int]:
        """Requesters served by forwarders with local rank ``local``, in rank order."""
        return [h * self.local_size + local for h in range(self.hosts)]

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        payloads: list[list[torch.Tensor]],
        batch_sizes: list[int],
        codec: Codec,
        count_nonfinite: Callable[[torch.Tensor | int], None],
    ) -> torch.Tensor:
        """Owner payloads (per requester, per request) in; the bytes this rank receives out:
        per host, one encoded ``[B, width]`` block per key of :meth:`keys` (rank, host)."""
        routes, rank = self.routes, self.rank

        def nbytes(q: int, request: Request) -> int:
            return batch_sizes[q] * codec.row_bytes(request.block.width)

        # Stage 1: owners -> forwarder with the requester's local rank, inside the host.
        sends = [
            [
                payloads[q][i].reshape(-1)
                for q in self.requesters_of(peer)
                for i in range(len(payloads[q]))
            ]
            for peer in range(self.local_size)
        ]
        sizes = [sum(t.numel() for t in per) for per in sends]
        mine = self.requesters_of(self.local)
        recv_sizes = [
            sum(nbytes(q, r) for q in mine for r in routes.requests(q, owner))
            for owner in self.owners_on(self.host)
        ]
        received = all_to_all_rows(
            self._cat(functools.reduce(operator.iadd, sends, [])),
            sizes,
            recv_sizes,
            self.host_group,
        )
        parts: dict[tuple[int, Key], list[torch.Tensor]] = {}
        for owner, data in zip(
            self.owners_on(self.host), torch.split(received, recv_sizes), strict=True
        ):
            start = 0
            for q in mine:
                for request in routes.requests(q, owner):
                    n = nbytes(q, request)
                    rows = data[start : start + n].reshape(
                        batch_sizes[q], codec.row_bytes(request.block.width)
                    )
                    parts.setdefault((q, (request.slot, request.block.col_shard)), []).append(rows)
                    start += n
        # Reduce per key, then stage 2: forwarder -> requester, across hosts. Every key with
        # several partials is reduced and re-encoded in one unpack-reduce and one pack.
        reduced = [
            (q, key, request)
            for q in mine
            for key, request in self.keys(q, self.host)
            if len(parts[(q, key)]) > 1
        ]
        encoded: dict[tuple[int, Key], torch.Tensor] = {}
        if reduced:
            summed, packed = _reduction_layouts(
                tuple(
                    (batch_sizes[q], request.block.width, len(parts[(q, key)]))
                    for q, key, request in reduced
                )
            )
            stacked = torch.cat([p.reshape(-1) for q, key, _ in reduced for p in parts[(q, key)]])
            payload, count = pack(unpack_reduce(stacked, summed, codec), packed, codec)
            count_nonfinite(count)
            chunks = payload.split(packed.split_bytes(codec))
            encoded = {(q, key): c for (q, key, _), c in zip(reduced, chunks, strict=True)}
        sends2, sizes2 = [], []
        for q in mine:
            size = 0
            for key, _ in self.keys(q, self.host):
                chunk = encoded.get((q, key))
                if chunk is None:  # a lone partial is forwarded as it came
                    chunk = parts[(q, key)][0].reshape(-1)
                sends2.append(chunk)
                size += chunk.numel()
            sizes2.append(size)
        recv2 = [sum(nbytes(rank, r) for _, r in self.keys(rank, h)) for h in range(self.hosts)]
        # Each direction on its own gloo connection (exchange.cross_host_rows).
        return cross_host_rows(self._cat(sends2), sizes2, recv2, self.local_size, self.group)

    # ----------------------------------------------------------------- backward
    def backward(
        self,
        send: torch.Tensor,
        sizes: list[int],
        pieces_per_source: list[list[Any]],
        batch_sizes: list[int],
        codec: Codec,
    ) -> list[list[torch.Tensor]]:
        """This requester's encoded gradients in (per host, one block per key of :meth:`keys`,
        as :meth:`forward` delivered the rows; ``sizes``: bytes per host); per source, per
        request, decoded gradient rows out."""
        routes, rank = self.routes, self.rank

        def nbytes(q: int, request: Request) -> int:
            return batch_sizes[q] * codec.row_bytes(request.block.width)

        # Stage 2': requester -> forwarder of each host, across hosts.
        mine = self.requesters_of(self.local)
        recv_sizes = [sum(nbytes(q, r) for _, r in self.keys(q, self.host)) for q in mine]
        received = cross_host_rows(send, sizes, recv_sizes, self.local_size, self.group)
        by_key: dict[tuple[int, Key], torch.Tensor] = {}
        for q, data in zip(mine, torch.split(received, recv_sizes), strict=True):
            start = 0
            for key, request in self.keys(q, self.host):
                n = nbytes(q, request)
                by_key[(q, key)] = data[start : start + n]
                start += n
        # Stage 1': forwarder -> every owner of the key on this host (one copy per row shard).
        sends1 = [
            [
                by_key[(q, (r.slot, r.block.col_shard))]
                for q in mine
                for r in routes.requests(q, owner)
            ]
            for owner in self.owners_on(self.host)
        ]
        sizes1 = [sum(t.numel() for t in per) for per in sends1]
        recv1 = [
            sum(nbytes(q, r) for q in self.requesters_of(peer) for r in routes.requests(q, rank))
            for peer in range(self.local_size)
        ]
        received1 = all_to_all_rows(
            self._cat(functools.reduce(operator.iadd, sends1, [])), sizes1, recv1, self.host_group
        )
        out: list[list[torch.Tensor]] = [[] for _ in range(routes.world_size)]
        for peer, data in zip(range(self.local_size), torch.split(received1, recv1), strict=True):
            start = 0
            for q in self.requesters_of(peer):
                for request in routes.requests(q, rank):
                    n = nbytes(q, request)
                    rows = data[start : start + n].reshape(
                        batch_sizes[q], codec.row_bytes(request.block.width)
                    )
                    out[q].append(decode_rows(rows, codec, request.block.width))
                    start += n
        assert all(len(out[q]) == len(pieces_per_source[q]) for q in range(routes.world_size))
        return out

    def _cat(self, chunks: list[torch.Tensor]) -> torch.Tensor:
        """One send buffer of byte chunks (an empty one on the cluster's device)."""
        return (
            torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8, device=self.device)
        )


@functools.lru_cache(maxsize=256)
def _reduction_layouts(
    keys: tuple[tuple[int, int, int], ...],
) -> tuple[ExchangeLayout, ExchangeLayout]:
    """The layouts of a forwarder's reduction, per key ``(rows, width, partials)`` in order.

    Key ``k``'s sum is rows ``[R_k, R_k + rows)``, columns ``[0, width)`` of one
    ``[sum(rows), max(width)]`` buffer. The first layout reads the keys' encoded
    partials one after another (in owner rank order: the sum is ``0 + p_1 + p_2 + ...``,
    as the reference adds them); the second packs each sum as one block, keys in order,
    so its split sizes cut the encoded sums apart.
    """
    summed, packed, start = [], [], 0
    for rows, width, partials in keys:
        whole = RankSlice(row_start=start, row_stop=start + rows, blocks=((0, width),))
        summed.append((whole,) * partials)
        packed.append(whole)
        start += rows
    cols = max(width for _, width, _ in keys)
    return (
        ExchangeLayout(ranks=summed, num_rows=start, num_cols=cols),
        ExchangeLayout(ranks=packed, num_rows=start, num_cols=cols),
    )
