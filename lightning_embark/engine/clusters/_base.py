"""Embedding clusters: the plug point that turns a local batch into pooled vectors.

A :class:`Cluster` owns the blocks this rank holds for one cluster of the plan and
runs the cluster's exchange in forward (pooled vectors for the local batch) and in
backward (gradients to the owners, then the sparse optimizer). The sharded module
calls every cluster in plan order inside one autograd node, and every collective goes
through the engine's lane (:mod:`lightning_embark.engine._lane`), so every rank issues
the same collectives in the same order in forward and in backward, while a cluster's
exchange overlaps the next cluster's own work.

Implementations: :class:`~.dp.DPCluster` (replicated tables, local lookups) and, on
top of :class:`~.remote.RemoteCluster` (tables held by owner ranks, looked up by
request), :class:`~.rb.RBCluster` and :class:`~.ub.UBCluster`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._lane import INLINE, Lane, Pending
from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.stores import ShardStore
from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """Execution options shared by every cluster of a sharded module.

    Attributes:
        optimizer: The sparse optimizer applied at the owners.
        kernel: ``"auto"`` (fbgemm where it works), ``"fbgemm"`` or ``"torch"``.
        group: Process group the plan's ranks index (None: the default group).
        ranks_per_host: Ranks per host of the plan (hierarchical exchanges).
        weighted: Whether features carry per-sample weights (KJT weights).
        device: Where blocks, optimizer state and every buffer a cluster makes live (the
            engine's device). The batches are there too, and so is everything sent through
            a collective (CPU tensors for gloo, CUDA tensors for NCCL); only the split
            sizes the collectives take as Python lists come to the host.
        input_group: The group a pipelined input distribution (:meth:`Cluster.distribute`
            run ahead of its step) exchanges over, the same ranks as ``group`` in a group of
            their own so that it never interleaves with the step's exchanges; None: no
            pipeline.
    """

    optimizer: SparseOptimizer
    store: str = "auto"
    group: Any = None
    ranks_per_host: int = 1
    weighted: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    input_group: Any = None

    def __post_init__(self) -> None:
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(
                f"engine device {self.device!r} is not a torch device ({error}); pass e.g. "
                "'cpu' or 'cuda:0'"
            ) from None
        object.__setattr__(self, "device", device)


class Cluster(ABC):
    """One embedding cluster executed on this rank."""

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        self.routes = routes
        self.rank = rank
        self.options = options
        #: Where the cluster's blocks and every buffer it makes live (the engine's device).
        self.device = options.device
        self.name = routes.cluster.name
        # Non-finite values this rank's encoders met: counts known on the host, and the
        # device's running totals, one per thread that encodes (the training thread, the
        # lane), each summed on that thread's stream.
        self._nonfinite_host = 0
        self._nonfinite_device: dict[int, torch.Tensor] = {}

    def count_nonfinite(self, count: torch.Tensor | int) -> None:
        """Add an encoder's non-finite count without reading it: a device count stays on
        the device (reading it would make the host wait for the stream, once per encoded
        block), until :attr:`nonfinite` is read."""
        if not isinstance(count, torch.Tensor):
            self._nonfinite_host += count
            return
        thread = threading.get_ident()
        total = self._nonfinite_device.get(thread)
        if total is None:
            self._nonfinite_device[thread] = count.to(torch.int64).clone()
        else:
            total.add_(count)

    @property
    def nonfinite(self) -> int:
        """Non-finite values met so far: one host read of the device totals (a sync on
        CUDA; read it after the lane's work was waited for, as the engine does)."""
        totals = list(self._nonfinite_device.values())
        return self._nonfinite_host + (int(torch.stack(totals).sum()) if totals else 0)

    @property
    def exchanges(self) -> bool:
        """Whether forward communicates (and can so carry a batch-validation status)."""
        return True

    @abstractmethod
    def start_forward(
        self,
        batch: JaggedBatch,
        *,
        keep_for_backward: bool,
        lane: Lane,
        error: ConfigError | None = None,
        prepared: Any = None,
    ) -> tuple[Pending[torch.Tensor], Any]:
        """The pooled ``[B, sum(d)]`` of the cluster's features, in its feature order
        (pending on ``lane``), and a context for :meth:`start_backward`.

        The rank's own work (lookups, encoding) runs here, on the caller's thread; every
        collective goes through ``lane``, so the exchange that ends the forward may still be
        under way when this returns (the engine starts the next cluster meanwhile).

        ``error`` is a local batch-validation failure: the cluster still takes part in
        its first collective (so peers are not left waiting), tells them, and raises.
        ``prepared``: the batch's input distribution, run ahead (:meth:`distribute`).
        """

    @abstractmethod
    def start_backward(self, ctx: Any, grad: torch.Tensor, *, lane: Lane) -> Pending[None]:
        """Exchange the pooled gradient ``[B, sum(d)]`` and update the owned rows (the
        exchange and the update pending on ``lane``)."""

    def forward(
        self,
        batch: JaggedBatch,
        *,
        keep_for_backward: bool,
        error: ConfigError | None = None,
        prepared: Any = None,
    ) -> tuple[torch.Tensor, Any]:
        """:meth:`start_forward` run to its end, inline (one cluster on its own)."""
        pending, ctx = self.start_forward(
            batch,
            keep_for_backward=keep_for_backward,
            lane=INLINE,
            error=error,
            prepared=prepared,
        )
        return pending.wait(), ctx

    def backward(self, ctx: Any, grad: torch.Tensor) -> None:
        """:meth:`start_backward` run to its end, inline."""
        self.start_backward(ctx, grad, lane=INLINE).wait()

    @property
    def distributes_input(self) -> bool:
        """Whether forward starts by distributing the batch's IDs to owners
        (:meth:`distribute`), work that reads no weight and can so run a step ahead."""
        return False

    def distribute(
        self, batch: JaggedBatch, *, error: ConfigError | None = None, ahead: bool = False
    ) -> Any:
        """The batch's input distribution, for ``forward(prepared=...)``; ``ahead``: over
        ``EngineOptions.input_group`` (a step ahead of its lookup). Clusters that distribute
        no input (:attr:`distributes_input` False) have none to run ahead."""
        raise NotImplementedError(f"cluster {self.name!r} distributes no input")

    @abstractmethod
    def local_blocks(self) -> list[tuple[Any, torch.Tensor]]:
        """``(block, weights)`` for every block this rank holds."""

    @abstractmethod
    def stores(self) -> list[tuple[ShardStore, list[int]]]:
        """This rank's stores, each with the indices (in :meth:`local_blocks` order) of its blocks.

        Checkpoints read and write optimizer state through them.
        """


def mean_multiplier(batch: JaggedBatch, means: list[bool], dims: list[int]) -> torch.Tensor:
    """``[B, sum(d)]``: ``1 / max(length, 1)`` per sample in the columns of the features
    pooled by mean (``means``), 1 elsewhere, so that one multiply scales a cluster's pooled
    output (or its gradient); empty bags give 0."""
    scale = 1.0 / batch.lengths.clamp_min(1).to(torch.float32)
    mask = to_device(means, dtype=torch.bool, device=scale.device)
    scale = torch.where(mask[:, None], scale, torch.ones((), device=scale.device)).T
    if len(set(dims)) == 1:
        return scale.unsqueeze(2).expand(-1, -1, dims[0]).reshape(scale.shape[0], sum(dims))
    widths = to_device(dims, dtype=torch.int64, device=scale.device)
    return torch.repeat_interleave(scale, widths, dim=1, output_size=sum(dims))
