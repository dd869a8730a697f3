"""Clusters whose tables live at owner ranks (RB and UB): one fused exchange per phase.

Forward, for all tables of the cluster at once:

1. header - ``[status, n_1, ..., n_m]`` int64 to every peer, ``m`` = requests to
   that peer (``status`` is the sender's batch size, or -1 when its batch failed
   validation so that every rank raises instead of waiting);
2. IDs - per peer one message of three sections, each request after request: bag
   lengths (RB only), IDs, and weights as int bits (RB, weighted), in the cluster's ID
   dtype (int32 whenever every shard's row count fits);
3. rows - owners look their blocks up (one table-batched kernel call per store) and send,
   per request, codec-encoded rows (RB: one pooled partial sum per sample; UB: one row
   per unique ID) as bytes.

Steps 1 and 2 read no weight: :meth:`RemoteCluster.distribute` runs them alone, so the
engine's input pipeline can run them for the next batch while this one trains; the
owner's side of it ends with its stores' bags in the kernels' layout
(:mod:`._owner_requests`).

Every step is whole-cluster tensor work, whatever the number of tables: messages are
gathered from the batch and cut apart with one gather each, encoding and decoding go
through one layout per exchange (:mod:`lightning_embark.kernels`), so a step's ops and
host copies do not grow with the tables. Only the header's counts come to the host
(once per cluster and direction), since they size the messages.

The lookups and the encoding run on the caller's thread; step 3's exchange and the pooling
after it run on the engine's lane (:mod:`lightning_embark.engine._lane`), so they overlap
the next cluster's lookups. Steps 1 and 2 go through the lane too, waited for at once (their
counts size the lookups).

Backward mirrors step 3 with the backward codec: requesters encode gradients on the
caller's thread; on the lane they send them, and owners decode and update through the
fused kernel - except blocks of replicated tables (``r > 1``), which first combine their
row gradients with their replicas, and, under row-wise Adagrad, column-split blocks,
which first gather each row's sum of squares from their column peers
(:mod:`._owner_blocks`, :mod:`._grad_sync`).

Every buffer lives on the engine's device (``EngineOptions.device``), headers included.

Subclasses say what a requester sends (:meth:`RemoteCluster.build`), how it receives
the rows that answer it and pools them (:meth:`receive`), how it encodes the gradients
each request gets (:meth:`encode_grads`), and how owners answer and update
(:meth:`owner_forward`, :meth:`owner_backward`).
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from lightning_embark._host_work import to_device
from lightning_embark.engine._jagged import JaggedBatch, segment_index
from lightning_embark.engine._lane import Lane, Pending
from lightning_embark.engine._optimizer import OptimizerKind
from lightning_embark.engine._routing import Block, ClusterRoutes
from lightning_embark.engine.clusters._base import Cluster, EngineOptions
from lightning_embark.engine.clusters._grad_sync import HEADER_DTYPE, split_list
from lightning_embark.engine.clusters._messages import Counted, OwnerCtx
from lightning_embark.engine.clusters._owner_blocks import (
    answer_layout,
    owner_blocks,
    update_synced,
)
from lightning_embark.engine.clusters._owner_requests import (
    Distributed,
    Sections,
    received_sections,
)
from lightning_embark.engine.stores import FlatBags, ShardStore, make_store
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import make_exchange
from lightning_embark.kernels import ExchangeLayout
from lightning_embark.wire import Codec, codec_for


class RemoteCluster(Cluster):
    """RB/UB machinery: requests to owners, table-batched lookup, rows back."""

    #: Whether owners pool bags (RB) or answer one row per ID (UB).
    pools_at_owner: bool = True

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        plan = routes.cluster
        self.exchange = make_exchange(
            hierarchical=plan.hierarchical,
            ranks_per_host=options.ranks_per_host,
            group=options.group,
        )
        #: The exchange of a pipelined input distribution (its own group), if any.
        self.input_exchange = (
            make_exchange(
                hierarchical=plan.hierarchical,
                ranks_per_host=options.ranks_per_host,
                group=options.input_group,
            )
            if options.input_group is not None
            else None
        )
        self.forward_codec: Codec = codec_for(plan.forward_compression, backward=False)
        self.backward_codec: Codec = codec_for(plan.backward_compression, backward=True)
        self.weighted = options.weighted and self.pools_at_owner
        rowwise = options.optimizer.kind is OptimizerKind.ROWWISE_ADAGRAD
        #: This rank's blocks, sorted by how they update (fused or synced).
        self.owned = owner_blocks(routes, rank, rowwise=rowwise)
        self.blocks: list[Block] = self.owned.blocks
        # Blocks whose update needs data from other ranks take the explicit path; the rest fuse.
        self.synced = self.owned.synced
        self.fused = self.owned.fused
        shapes = [(b.num_rows, b.width) for b in self.blocks]
        # The share of each block's rows the plan keeps in HBM (None: all; CUDA only).
        factors = [routes.tables[b.table].layout.cache_load_factor for b in self.blocks]
        self.fused_store = make_store(
            options.store,
            [shapes[i] for i in self.fused],
            options.optimizer,
            device=self.device,
            cache_load_factors=[factors[i] for i in self.fused],
        )
        self.synced_store = make_store(
            options.store,
            [shapes[i] for i in self.synced],
            options.optimizer,
            device=self.device,
            cache_load_factors=[factors[i] for i in self.synced],
        )
        #: The stores and their blocks (local indices), in output column order.
        self.members: list[tuple[ShardStore, list[int]]] = [
            (self.fused_store, self.fused),
            (self.synced_store, self.synced),
        ]
        self.world = routes.world_size
        #: Per source, the local block of each of its requests to this rank.
        self.incoming = [[r.local for r in routes.requests(q, rank)] for q in range(self.world)]
        #: Per peer, the requests this rank makes of it.
        self.outgoing = [routes.requests(rank, p) for p in range(self.world)]
        #: The stores' output's width: every block's columns, fused blocks then synced.
        self.store_width = self.owned.width

    # ----------------------------------------------------------------- subclass hooks
    @abstractmethod
    def count(self, batch: JaggedBatch) -> Counted:
        """The batch's requests counted on the device, and how to build the ID messages
        once those counts are on the host (see :class:`Counted`)."""

    @functools.cached_property
    def num_requests(self) -> int:
        """Requests this rank makes, over all peers."""
        return sum(len(requests) for requests in self.outgoing)

    @functools.cached_property
    def _header_index(self) -> torch.Tensor:
        """Where each header entry comes from in ``[batch size, *request counts]``: per
        peer, the size (0), then its requests' counts (in :attr:`outgoing` order)."""
        index: list[int] = []
        start = 1
        for requests in self.outgoing:
            index += [0, *range(start, start + len(requests))]
            start += len(requests)
        return to_device(index, dtype=torch.int64, device=self.device)

    @abstractmethod
    def owner_bags(
        self, sections: Sections, batch_sizes: list[int], counts: list[list[int]]
    ) -> tuple[FlatBags | None, FlatBags | None]:
        """The fused and synced stores' bags of the distributed requests."""

    @abstractmethod
    def owner_forward(
        self, prepared: Distributed, keep: bool
    ) -> tuple[torch.Tensor, list[int], OwnerCtx]:
        """Look the owned blocks up for the distributed requests and encode the answers:
        the send buffer (per requester, per request), its split sizes, the owner's step."""

    @abstractmethod
    def receive(
        self, ctx: Any, payload: torch.Tensor, sizes: list[int], batch_sizes: list[int]
    ) -> torch.Tensor:
        """Send the owners' encoded rows (``payload``, split ``sizes`` per requester) and
        return this rank's pooled ``[B, sum(d)]`` (features in cluster order) from the rows
        answering it (``batch_sizes``: every rank's, from the headers)."""

    @abstractmethod
    def encode_grads(self, ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The backward send buffer (per owner, per request: gradient rows shaped like the
        rows received, encoded with the backward codec) and its split sizes in bytes, from
        the pooled gradient ``[B, sum(d)]``."""

    @abstractmethod
    def grads_to_owners(
        self, owner_ctx: OwnerCtx, encoded: tuple[torch.Tensor, list[int]]
    ) -> torch.Tensor:
        """Requesters send each request its gradient rows; owners decode them into the
        stores' output shape ``[batch, store_width]``."""

    # ----------------------------------------------------------------- forward
    @property
    def distributes_input(self) -> bool:
        return True

    def start_forward(
        self,
        batch: JaggedBatch,
        *,
        keep_for_backward: bool,
        lane: Lane,
        error: ConfigError | None = None,
        prepared: Any = None,
    ) -> tuple[Pending[torch.Tensor], Any]:
        """Distribute the batch's IDs (unless ``prepared`` holds that distribution, done
        earlier by :meth:`distribute`), look the owned blocks up and encode them here, then
        exchange the rows and pool them on ``lane``."""
        if prepared is None:
            prepared = lane.run(lambda: self.distribute(batch, error=error))
        assert isinstance(prepared, Distributed)
        payload, sizes, owner_ctx = self.owner_forward(prepared, keep_for_backward)
        batch_sizes = prepared.batch_sizes
        req_ctx = prepared.req_ctx
        pooled = lane.start(
            lambda: self.receive(req_ctx, payload, sizes, batch_sizes),
            inputs=(payload, prepared),
        )
        return pooled, (owner_ctx, req_ctx)

    def distribute(
        self, batch: JaggedBatch, *, error: ConfigError | None = None, ahead: bool = False
    ) -> Distributed:
        """The batch's input distribution: headers, then every request's IDs to its owner,
        cut there into the stores' bags.

        None of it reads a weight, so it may run ahead of the step whose lookup uses it (the
        engine's input pipeline runs it over its own process group, ``exchange``, while the
        previous step computes: ``ahead``); by default it rides the cluster's exchange.

        Raises:
            ConfigError: ``error`` (this rank's batch failed its checks), or a peer's batch
                did; every rank raises after the header exchange, so no rank waits.
        """
        exchange = self.input_exchange if ahead else self.exchange
        assert exchange is not None, "distribute(ahead=True) needs EngineOptions.input_group"
        size = batch.batch_size
        header_sizes = [1 + len(requests) for requests in self.outgoing]
        header_recv_counts = [1 + len(blocks) for blocks in self.incoming]
        if error is None:
            # Every peer's header made on the device from the batch's counts: no host read
            # before the exchange.
            counted = self.count(batch)
            status = to_device([size], dtype=HEADER_DTYPE, device=self.device)
            header_send = torch.cat([status, counted.values[: self.num_requests]])
            header_send = header_send[self._header_index]
        else:
            # A batch that failed its checks sends status -1 and no counts.
            header_send = to_device(
                [v for n in header_sizes for v in (-1, *([0] * (n - 1)))],
                dtype=HEADER_DTYPE,
                device=self.device,
            )
        header, _ = exchange(header_send, header_sizes, header_recv_counts)
        if error is not None:
            raise error
        # One host copy: this rank's counts and its peers' headers, which size the ID
        # messages (Python split sizes).
        host = torch.cat([counted.values, header]).tolist()
        mine = host[: counted.values.numel()]
        headers = split_list(host[counted.values.numel() :], header_recv_counts)
        message = counted.finish(mine)
        bad = [q for q, h in enumerate(headers) if h[0] < 0]
        if bad:
            raise ConfigError(
                f"cluster {self.name!r}: rank(s) {bad} rejected their local batch (see their "
                "error: out-of-range IDs or malformed features); no data was exchanged"
            )
        batch_sizes: list[int] = [int(h[0]) for h in headers]
        counts: list[list[int]] = [list(h[1:]) for h in headers]
        per_id = 2 if self.weighted else 1
        recv_sizes = [
            (b * len(c) if self.pools_at_owner else 0) + per_id * sum(c)
            for b, c in zip(batch_sizes, counts, strict=True)
        ]
        received, _ = exchange(message.send, message.sizes, recv_sizes)
        sections = received_sections(
            received, batch_sizes, counts, pools=self.pools_at_owner, weighted=self.weighted
        )
        return Distributed(
            batch=batch,
            req_ctx=message.ctx,
            batch_sizes=batch_sizes,
            counts=counts,
            bags=self.owner_bags(sections, batch_sizes, counts),
            ids=sections.ids,
        )

    def gather_message(
        self,
        areas: list[torch.Tensor],
        segments: list[list[tuple[int, int]]],
    ) -> tuple[torch.Tensor, list[int]]:
        """The ID messages: ``areas`` concatenated (in the ID dtype), then cut per peer into
        its ``(start, length)`` segments, one gather for all peers."""
        id_dtype = self.routes.id_dtype
        source = (
            torch.cat([a.to(id_dtype) for a in areas]) if len(areas) > 1 else areas[0].to(id_dtype)
        )
        sizes = [sum(n for _, n in per) for per in segments]
        flat = [seg for per in segments for seg in per]
        index = segment_index([s for s, _ in flat], [n for _, n in flat], self.device)
        return source[index], sizes

    # ----------------------------------------------------------------- owner layout
    def owner_layout(
        self, rows: list[list[int]], starts: dict[tuple[int, int], int]
    ) -> ExchangeLayout:
        """Where each request's answer lies in the stores' output (:func:`answer_layout`)."""
        return answer_layout(self.owned, self.incoming, rows, starts)

    def stores_output(self, outs: Sequence[torch.Tensor | None], batch: int) -> torch.Tensor:
        """The stores' outputs side by side, ``[batch, store_width]`` (one store's as it is)."""
        present = [o for o in outs if o is not None]
        if len(present) == 1 and present[0].shape[0] == batch:
            return present[0]
        parts = []
        for out in present:
            if out.shape[0] < batch:
                out = torch.cat([out, out.new_zeros(batch - out.shape[0], out.shape[1])])
            parts.append(out[:batch])
        if not parts:
            return torch.zeros(batch, max(1, self.store_width), device=self.device)
        return torch.cat(parts, dim=1)

    def store_batch(self, bags: tuple[FlatBags | None, ...]) -> int:
        """Rows of the stores' output side by side: the longest store's padded batch."""
        return max([b.batch for b in bags if b is not None] or [1])

    # ----------------------------------------------------------------- backward
    def start_backward(self, ctx: Any, grad: torch.Tensor, *, lane: Lane) -> Pending[None]:
        """Encode the gradients here; send them to the owners, decode and update there on
        ``lane``."""
        owner_ctx, req_ctx = ctx
        encoded = self.encode_grads(req_ctx, grad)
        # The owners' bags and the kernels' handles are read on the lane too, and this thread
        # lets go of them before the lane's stream is done with them (it waits only at the
        # next lookup): recorded there like the buffer, or their memory could be handed out
        # again while the update still reads it.
        return lane.start(
            lambda: self.update_owners(owner_ctx, encoded),
            inputs=(encoded, owner_ctx.prepared.bags, owner_ctx.handles),
        )

    def update_owners(self, owner_ctx: OwnerCtx, encoded: tuple[torch.Tensor, list[int]]) -> None:
        """The owners' side of backward: the gradient exchange, the syncs, the updates."""
        full = self.grads_to_owners(owner_ctx, encoded)
        fused_bags, synced_bags = owner_ctx.prepared.bags
        fused_width = sum(self.blocks[i].width for i in self.fused)
        if fused_bags is not None:
            grad = full[: fused_bags.batch, :fused_width]
            self.owner_backward(self.fused_store, fused_bags, owner_ctx.handles[0], grad)
        if synced_bags is None:
            return
        update_synced(
            self.owned,
            self.synced_store,
            synced_bags,
            full[: synced_bags.batch, fused_width:],
            routes=self.routes,
            rank=self.rank,
            exchange=self.exchange,
            device=self.device,
        )

    def owner_backward(
        self, store: ShardStore, bags: FlatBags, handle: Any, grad: torch.Tensor
    ) -> None:
        """Update a fused store's blocks from the gradient of its output (RB: through the
        forward's handle; UB overrides: its rows were read without one)."""
        store.backward_flat(handle, bags, grad.contiguous())

    def stores(self) -> list[tuple[ShardStore, list[int]]]:
        # Fused blocks in one store, replica- or column-synced ones in another.
        return [(self.fused_store, list(self.fused)), (self.synced_store, list(self.synced))]

    def local_blocks(self) -> list[tuple[Any, torch.Tensor]]:
        weights: list[torch.Tensor] = [torch.empty(0, device=self.device)] * len(self.blocks)
        for i, w in zip(self.fused, self.fused_store.weights(), strict=True):
            weights[i] = w
        for i, w in zip(self.synced, self.synced_store.weights(), strict=True):
            weights[i] = w
        return list(zip(self.blocks, weights, strict=True))
