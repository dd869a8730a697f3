"""What a remote (RB or UB) cluster's requester sends and counts, and what an owner keeps
of a step: the records :class:`~._remote.RemoteCluster` and its subclasses pass between
their phases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark.engine.clusters._owner_requests import Distributed
from lightning_embark.kernels import ExchangeLayout


@dataclass(frozen=True, kw_only=True)
class Message:
    """What a requester sends its owners (:meth:`RemoteCluster.build`).

    Attributes:
        send: Every peer's ID message, one after another, in the cluster's ID dtype.
        sizes: Its length per peer.
        counts: Per peer, per request: the IDs sent (the header's counts).
        ctx: The requester's context of the batch (subclass-defined).
    """

    send: torch.Tensor
    sizes: list[int]
    counts: list[list[int]]
    ctx: Any


@dataclass(frozen=True, kw_only=True)
class Counted:
    """A requester's batch counted on its device, before anything comes to the host
    (:meth:`RemoteCluster.count`).

    Attributes:
        values: int64 on the cluster's device: first every request's ID count, peer after
            peer in :attr:`RemoteCluster.outgoing` order (the header's counts), then
            whatever else :attr:`finish` needs on the host.
        finish: Builds the :class:`Message` from ``values`` copied to the host.
    """

    values: torch.Tensor
    finish: Callable[[list[int]], Message]


@dataclass(kw_only=True)
class OwnerCtx:
    """An owner's step: the distribution it answered and what its update needs."""

    prepared: Distributed
    handles: list[Any]  # per store, the kernel's handle for backward (or None)
    layout: ExchangeLayout | None  # where each request's rows are in the stores' output
