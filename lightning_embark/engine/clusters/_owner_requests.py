"""The owner's side of an input distribution: ID messages in, one bag list per block out.

Part of :class:`~.remote.RemoteCluster`'s distribution (:meth:`~.remote.RemoteCluster.
distribute`): each source rank's message holds, request by request, what the requester
sends (:func:`weights_as_ints` puts per-sample weights in the ID dtype to ride along);
:func:`owned_bags` cuts every message apart into the owned blocks' bags and remembers which
rows answer which request (:class:`Piece`), all that a later lookup needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.stores import Bags


@dataclass(frozen=True, kw_only=True)
class Piece:
    """The rows an owner answers one request with: from ``source``, of owned block
    ``local``, ``num_rows`` of them (RB: one per sample; UB: one per ID)."""

    source: int
    local: int
    num_rows: int


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """A batch's input distribution at this rank (:meth:`RemoteCluster.distribute`)."""

    req_ctx: Any  # the requester's context of the batch (subclass-defined)
    bags: list[Bags]  # per owned block: the IDs (and bag offsets) requested of it
    pieces: list[list[Piece]]  # per source, in request order
    batch_sizes: list[int]  # every requester's, from the headers


def owned_bags(
    routes: ClusterRoutes,
    rank: int,
    num_blocks: int,
    headers: list[list[int]],
    received: list[torch.Tensor],
    *,
    pools: bool,
    weighted: bool,
    device: torch.device,
) -> tuple[list[Bags], list[list[Piece]]]:
    """Every owned block's bags from the ID messages received (one per source rank, laid
    out request by request as the headers count them: ``[lengths (RB)] ids [weights as
    int bits]``), and the pieces that say which rows answer which request.

    Args:
        routes: The cluster's routes (which requests each source makes of ``rank``).
        rank: This (owner) rank.
        num_blocks: The blocks ``rank`` owns in the cluster.
        headers: Per source, ``[batch size, IDs per request...]``.
        received: Per source, its ID message (in the cluster's ID dtype).
        pools: RB: bags of every sample; UB: one row per ID.
        weighted: The message carries per-sample weights.
        device: Where the bags are made.
    """
    ids: list[list[torch.Tensor]] = [[] for _ in range(num_blocks)]
    lengths: list[list[torch.Tensor]] = [[] for _ in range(num_blocks)]
    weights: list[list[torch.Tensor]] = [[] for _ in range(num_blocks)]
    pieces: list[list[Piece]] = []
    for q in range(routes.world_size):
        bags, counts = headers[q][0], headers[q][1:]
        cursor, mine = 0, []
        data = received[q]
        # One int64 copy of the source's message; lengths and IDs are then views of it.
        wide = data.to(torch.int64)
        for request, n in zip(routes.requests(q, rank), counts, strict=True):
            local = request.local
            if pools:
                lengths[local].append(wide[cursor : cursor + bags])
                cursor += bags
            ids[local].append(wide[cursor : cursor + n])
            cursor += n
            if weighted:
                weights[local].append(ints_as_weights(data[cursor : cursor + n]))
                cursor += n
            mine.append(Piece(source=q, local=local, num_rows=bags if pools else n))
        pieces.append(mine)
    all_bags = []
    for local in range(num_blocks):
        idx = (
            torch.cat(ids[local])
            if ids[local]
            else torch.zeros(0, dtype=torch.int64, device=device)
        )
        if pools:
            lens = (
                torch.cat(lengths[local])
                if lengths[local]
                else torch.zeros(0, dtype=torch.int64, device=device)
            )
            offsets = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
        else:
            offsets = torch.arange(idx.numel() + 1, device=device)
        w = torch.cat(weights[local]) if weighted and weights[local] else None
        all_bags.append(Bags(indices=idx, offsets=offsets, weights=w))
    return all_bags, pieces


def weights_as_ints(
    weights: torch.Tensor | None, ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Per-sample weights (fp32) of ``ids`` bit-cast into the ID dtype, to ride the ID
    message (all ones, on the IDs' device, when there are none)."""
    w = weights if weights is not None else torch.ones(ids.numel(), device=ids.device)
    return w.to(torch.float32).contiguous().view(torch.int32).to(dtype)


def ints_as_weights(data: torch.Tensor) -> torch.Tensor:
    """:func:`weights_as_ints` undone: the fp32 weights whose bits ``data`` carries."""
    return data.to(torch.int32).view(torch.float32)
