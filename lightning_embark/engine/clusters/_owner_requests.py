"""The owner's side of an input distribution: ID messages in, kernel-ready bags out.

Part of :class:`~.remote.RemoteCluster`'s distribution (:meth:`~.remote.RemoteCluster.
distribute`). Each source rank's message holds three sections, each request after
request in the order :meth:`~lightning_embark.engine._routing.ClusterRoutes.requests`
gives: the bag lengths (RB: ``B_q`` per request), the IDs, and the per-ID weights as
int bits (:func:`weights_as_ints`; RB, weighted). :func:`received_sections` cuts the
received buffer into those sections, every source's one after another; the stores want
their blocks' bags block after block, each block padded to the longest
(:class:`FlatBags`, the layout of fbgemm's table-batched kernels), which
:func:`pooled_bags` (RB) and :func:`row_bags` (UB: one ID per bag) build with whole-buffer
gathers. What depends only on the batch sizes is built once and kept.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import (
    JaggedBatch,
    device_segment_index,
    segment_index,
)
from lightning_embark.engine.stores import FlatBags


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """A batch's input distribution at this rank (:meth:`RemoteCluster.distribute`).

    Attributes:
        batch: The requester's batch (the cluster's features).
        req_ctx: The requester's context of the batch (subclass-defined).
        batch_sizes: Every requester's batch size, from the headers.
        counts: Per source, per request to this rank: the IDs it sent.
        bags: Per store of this rank (fused, synced), its blocks' bags.
        ids: The received IDs in source order, then request order.
    """

    batch: JaggedBatch
    req_ctx: Any
    batch_sizes: list[int]
    counts: list[list[int]]
    bags: tuple[FlatBags | None, ...]
    ids: Tensor


@dataclass(frozen=True, kw_only=True)
class Sections:
    """The received ID messages cut apart: every source's section of each kind, one
    source after another."""

    lengths: Tensor | None  # int64 bag lengths (RB)
    ids: Tensor  # int64
    weights: Tensor | None  # fp32


def received_sections(
    received: Tensor,
    batch_sizes: Sequence[int],
    counts: Sequence[Sequence[int]],
    *,
    pools: bool,
    weighted: bool,
) -> Sections:
    """Cut the concatenated messages (one per source, as the headers count them) into
    lengths, IDs and weights, each in source order."""
    device = received.device
    len_starts, len_sizes, id_starts, id_sizes, w_starts = [], [], [], [], []
    start = 0
    for size, per_request in zip(batch_sizes, counts, strict=True):
        n = sum(per_request)
        bags = size * len(per_request) if pools else 0
        len_starts.append(start)
        len_sizes.append(bags)
        id_starts.append(start + bags)
        id_sizes.append(n)
        w_starts.append(start + bags + n)
        start += bags + n * (2 if weighted else 1)
    wide = received.to(torch.int64)
    lengths = wide[segment_index(len_starts, len_sizes, device)] if pools else None
    ids = wide[segment_index(id_starts, id_sizes, device)]
    weights = (
        ints_as_weights(received[segment_index(w_starts, id_sizes, device)]) if weighted else None
    )
    return Sections(lengths=lengths, ids=ids, weights=weights)


def pooled_bags(
    sections: Sections,
    incoming: Sequence[Sequence[int]],
    members: Sequence[int],
    batch_sizes: Sequence[int],
    counts: Sequence[Sequence[int]],
) -> FlatBags | None:
    """RB: the bags of the blocks ``members`` (local indices, store order), each block's
    bags from every source in source order, then request order.

    Args:
        sections: The received messages, cut apart.
        incoming: Per source, the local block of each of its requests.
        members: The store's blocks.
        batch_sizes: Every source's batch size.
        counts: Per source, per request: its IDs.
    """
    if not members:
        return None
    assert sections.lengths is not None
    device = sections.ids.device
    index, num_bags, batch = _bag_order(
        tuple(tuple(i) for i in incoming), tuple(members), tuple(batch_sizes), device
    )
    lengths = sections.lengths
    pad = lengths.new_zeros(1)
    starts = torch.cumsum(lengths, 0) - lengths
    bag_lengths = torch.cat([lengths, pad])[index]
    bag_starts = torch.cat([starts, pad])[index]
    position = {local: t for t, local in enumerate(members)}
    per_block = [0] * len(members)
    for blocks, per_request in zip(incoming, counts, strict=True):
        for local, n in zip(blocks, per_request, strict=True):
            if local in position:
                per_block[position[local]] += n
    ids = device_segment_index(bag_starts, bag_lengths, sum(per_block))
    offsets = torch.cat([bag_lengths.new_zeros(1), torch.cumsum(bag_lengths, 0)])
    weights = sections.weights[ids] if sections.weights is not None else None
    return FlatBags(
        indices=sections.ids[ids],
        offsets=offsets,
        weights=weights,
        num_bags=num_bags,
        batch=batch,
        id_counts=tuple(per_block),
    )


@functools.lru_cache(maxsize=64)
def _bag_order(
    incoming: tuple[tuple[int, ...], ...],
    members: tuple[int, ...],
    batch_sizes: tuple[int, ...],
    device: torch.device,
) -> tuple[Tensor, tuple[int, ...], int]:
    """Where each store bag comes from in the received lengths (padding: one past the end),
    the real bags per block and the padded batch; fixed by the plan and the batch sizes."""
    position = {local: t for t, local in enumerate(members)}
    segments: list[list[tuple[int, int]]] = [[] for _ in members]
    start = 0
    for size, blocks in zip(batch_sizes, incoming, strict=True):
        for local in blocks:
            if local in position:
                segments[position[local]].append((start, size))
            start += size
    num_bags = tuple(sum(n for _, n in segs) for segs in segments)
    batch = max(1, max(num_bags))
    starts, sizes = [], []
    for segs, n in zip(segments, num_bags, strict=True):
        starts += [s for s, _ in segs] + [start]
        sizes += [n for _, n in segs] + [batch - n]
    # Padding reads position ``start`` (one past the received lengths): a zero.
    index = (
        torch.cat(
            [
                torch.arange(s, s + n, device="cpu")
                if s < start
                else torch.full((n,), start, device="cpu")
                for s, n in zip(starts, sizes, strict=True)
            ]
        )
        if starts
        else torch.zeros(0, dtype=torch.int64, device="cpu")
    )
    return index.to(device), num_bags, batch


def row_bags(
    ids: Tensor,
    incoming: Sequence[Sequence[int]],
    members: Sequence[int],
    counts: Sequence[Sequence[int]],
) -> FlatBags | None:
    """UB: one bag per received ID, of the blocks ``members``, each block's IDs from every
    source in source order, then request order (``ids``: the received IDs in source
    order)."""
    if not members:
        return None
    position = {local: t for t, local in enumerate(members)}
    segments: list[list[tuple[int, int]]] = [[] for _ in members]
    start = 0
    for blocks, per_request in zip(incoming, counts, strict=True):
        for local, n in zip(blocks, per_request, strict=True):
            if local in position:
                segments[position[local]].append((start, n))
            start += n
    num_bags = tuple(sum(n for _, n in segs) for segs in segments)
    batch = max(1, max(num_bags))
    flat = [seg for segs in segments for seg in segs]
    device = ids.device
    index = segment_index([s for s, _ in flat], [n for _, n in flat], device)
    real = to_device(num_bags, dtype=torch.int64, device=device)
    lengths = (torch.arange(batch, device=device)[None, :] < real[:, None]).to(torch.int64)
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths.reshape(-1), 0)])
    return FlatBags(
        indices=ids[index],
        offsets=offsets,
        weights=None,
        num_bags=num_bags,
        batch=batch,
        id_counts=num_bags,  # one bag per ID
    )


def request_starts(
    incoming: Sequence[Sequence[int]],
    members: Sequence[int],
    sizes: Sequence[Sequence[int]],
) -> dict[tuple[int, int], int]:
    """Per ``(source, request)`` of a store's blocks: its first bag in its block (the bags
    of a block follow source order, then request order); ``sizes`` per source, per
    request: its bags."""
    position = {local: t for t, local in enumerate(members)}
    cursor = [0] * len(members)
    out = {}
    for q, (blocks, per_request) in enumerate(zip(incoming, sizes, strict=True)):
        for r, (local, n) in enumerate(zip(blocks, per_request, strict=True)):
            if local in position:
                t = position[local]
                out[(q, r)] = cursor[t]
                cursor[t] += n
    return out


def weights_as_ints(weights: Tensor | None, ids: Tensor, dtype: torch.dtype) -> Tensor:
    """Per-sample weights (fp32) of ``ids`` bit-cast into the ID dtype, to ride the ID
    message (all ones, on the IDs' device, when there are none)."""
    w = weights if weights is not None else torch.ones(ids.numel(), device=ids.device)
    return w.to(torch.float32).contiguous().view(torch.int32).to(dtype)


def ints_as_weights(data: Tensor) -> Tensor:
    """:func:`weights_as_ints` undone: the fp32 weights whose bits ``data`` carries."""
    return data.to(torch.int32).view(torch.float32)


def running(counts: Sequence[int]) -> list[int]:
    """Exclusive prefix sums of ``counts``."""
    return list(itertools.accumulate(counts, initial=0))[:-1]
