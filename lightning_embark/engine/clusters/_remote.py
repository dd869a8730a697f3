"""Clusters whose tables live at owner ranks (RB and UB): one fused exchange per phase.

Forward, for all tables of the cluster at once:

1. header - ``[status, n_1, ..., n_m]`` int64 to every peer, ``m`` = requests to
   that peer (``status`` is the sender's batch size, or -1 when its batch failed
   validation so that every rank raises instead of waiting);
2. IDs - per request ``[lengths (RB only)] ids [weights as int bits (RB, weighted)]``
   in the cluster's ID dtype (int32 whenever every shard's row count fits);
3. rows - owners look their blocks up (table-batched) and send, per request,
   codec-encoded rows (RB: one pooled partial sum per sample; UB: one row per
   unique ID) as bytes.

Steps 1 and 2 read no weight: :meth:`RemoteCluster.distribute` runs them alone, so the
engine's input pipeline can run them for the next batch while this one trains.

The lookups and the encoding run on the caller's thread; step 3's exchange and the pooling
after it run on the engine's lane (:mod:`lightning_embark.engine._lane`), so they overlap
the next cluster's lookups. Steps 1 and 2 go through the lane too, waited for at once (their
counts size the lookups).

Backward mirrors step 3 with the backward codec: requesters encode gradients per
request on the caller's thread; on the lane they send them, and owners decode and update
through the fused kernel - except blocks of replicated tables (``r > 1``), which first
combine their row gradients with their replicas, and, under row-wise Adagrad,
column-split blocks, which first gather each row's sum of squares from their column
peers (:mod:`.grad_sync`).

Every encode and decode goes through the kernels' ops (:mod:`lightning_embark.kernels`):
Triton on CUDA tensors, the codecs' pure-torch reference on the CPU (or whichever
``EMBARK_KERNEL_BACKEND`` forces), the same bytes either way.

Every buffer lives on the engine's device (``EngineOptions.device``), headers included:
the collectives take tensors there (CPU for gloo, CUDA for NCCL). A received header
comes to the host once, as a list, since its counts size the next messages.

Subclasses say what a requester sends (:meth:`RemoteCluster.build`), how it receives
the rows that answer it and pools them (:meth:`receive`), and how it encodes the
gradients each request gets (:meth:`encode_grads`).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._lane import Lane, Pending
from lightning_embark.engine._optimizer import OptimizerKind
from lightning_embark.engine._routing import Block, ClusterRoutes
from lightning_embark.engine.clusters._base import Cluster, EngineOptions
from lightning_embark.engine.clusters._grad_sync import (
    HEADER_DTYPE,
    column_sync,
    replica_sync,
    split_list,
)
from lightning_embark.engine.clusters._owner_requests import (
    Distributed,
    Piece,
    owned_bags,
    weights_as_ints,
)
from lightning_embark.engine.stores import Bags, ShardStore, make_store, row_grads
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import make_exchange
from lightning_embark.kernels import decode_rows, encode_rows
from lightning_embark.wire import Codec, codec_for


@dataclass(frozen=True, kw_only=True)
class Outgoing:
    """What a requester sends for one request: local row ids, and bag lengths for RB."""

    ids: torch.Tensor
    lengths: torch.Tensor | None = None
    weights: torch.Tensor | None = None


@dataclass(kw_only=True)
class _OwnerCtx:
    pieces: list[list[Piece]]  # per source, in request order
    bags: list[Bags]  # per local block
    handle: Any
    pooled: list[torch.Tensor] | None  # per local block until encoded
    batch_sizes: list[int]  # every requester's, from the headers


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
        self.blocks: list[Block] = routes.blocks[rank]
        rowwise = options.optimizer.kind is OptimizerKind.ROWWISE_ADAGRAD
        self.replicated = [
            i for i, b in enumerate(self.blocks) if routes.tables[b.table].layout.num_replicas > 1
        ]
        self.column_split = [
            i
            for i, b in enumerate(self.blocks)
            if rowwise and routes.tables[b.table].layout.num_col_shards > 1
        ]
        # Blocks whose update needs data from other ranks take the explicit path; the rest fuse.
        self.synced = sorted(set(self.replicated) | set(self.column_split))
        self.fused = [i for i in range(len(self.blocks)) if i not in self.synced]
        self.has_sync = any(t.layout.num_replicas > 1 for t in routes.tables)
        self.has_column_sync = rowwise and any(t.layout.num_col_shards > 1 for t in routes.tables)
        shapes = [(b.num_rows, b.width) for b in self.blocks]
        # The share of each block's rows the plan keeps in HBM (None: all; CUDA only).
        factors = [routes.tables[b.table].layout.cache_load_factor for b in self.blocks]
        # RB blocks all answer every requester's bags (one padded kernel call fits); UB
        # blocks answer very different row counts (one kernel per block, no padding).
        batch = self.pools_at_owner
        self.fused_store = make_store(
            options.kernel,
            [shapes[i] for i in self.fused],
            options.optimizer,
            batch_blocks=batch,
            device=self.device,
            cache_load_factors=[factors[i] for i in self.fused],
        )
        self.synced_store = make_store(
            options.kernel,
            [shapes[i] for i in self.synced],
            options.optimizer,
            batch_blocks=batch,
            device=self.device,
            cache_load_factors=[factors[i] for i in self.synced],
        )
        self.world = routes.world_size

    # ----------------------------------------------------------------- subclass hooks
    @abstractmethod
    def build(self, batch: list[FeatureBatch]) -> tuple[list[list[Outgoing]], Any]:
        """Per owner, per request of ``routes.requests(rank, owner)``: what to send."""

    @abstractmethod
    def receive(
        self,
        batch: list[FeatureBatch],
        ctx: Any,
        payloads: list[list[torch.Tensor]],
        batch_sizes: list[int],
    ) -> list[torch.Tensor]:
        """Send the owners' encoded rows (``payloads``: per requester, per request) and
        return this rank's pooled ``[B, d]`` per feature from the rows answering it
        (``batch_sizes``: every rank's, from the headers)."""

    @abstractmethod
    def encode_grads(self, ctx: Any, grads: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """The backward send buffer (per owner, per request: gradient rows shaped like the
        rows received, encoded with the backward codec) and its split sizes in bytes."""

    # ----------------------------------------------------------------- forward
    @property
    def distributes_input(self) -> bool:
        return True

    def start_forward(
        self,
        batch: list[FeatureBatch],
        *,
        keep_for_backward: bool,
        lane: Lane,
        error: ConfigError | None = None,
        prepared: Any = None,
    ) -> tuple[Pending[list[torch.Tensor]], Any]:
        """Distribute the batch's IDs (unless ``prepared`` holds that distribution, done
        earlier by :meth:`distribute`), look the owned blocks up and encode them here, then
        exchange the rows and pool them on ``lane``."""
        if prepared is None:
            prepared = lane.run(lambda: self.distribute(batch, error=error))
        assert isinstance(prepared, Distributed)
        owner_ctx = self._lookup(prepared, keep_for_backward)
        payloads = self._piece_payloads(owner_ctx)
        sizes = owner_ctx.batch_sizes
        pooled = lane.start(
            lambda: self.receive(batch, prepared.req_ctx, payloads, sizes),
            inputs=(payloads, batch),
        )
        return pooled, (owner_ctx, prepared.req_ctx)

    def distribute(
        self, batch: list[FeatureBatch], *, error: ConfigError | None = None, ahead: bool = False
    ) -> Distributed:
        """The batch's input distribution: headers, then every request's IDs to its owner,
        unpacked there into one bag list per owned block.

        None of it reads a weight, so it may run ahead of the step whose lookup uses it (the
        engine's input pipeline runs it over its own process group, ``exchange``, while the
        previous step computes: ``ahead``); by default it rides the cluster's exchange.

        Raises:
            ConfigError: ``error`` (this rank's batch failed its checks), or a peer's batch
                did; every rank raises after the header exchange, so no rank waits.
        """
        exchange = self.input_exchange if ahead else self.exchange
        assert exchange is not None, "distribute(ahead=True) needs EngineOptions.input_group"
        size = batch[0].batch_size if batch else 0
        outgoing, req_ctx = self.build(batch) if error is None else (None, None)
        # Every peer's header in one host list, one tensor (not one per peer and a cat).
        header_send: list[int] = []
        header_sizes = []
        for p in range(self.world):
            num = len(self.routes.requests(self.rank, p))
            counts = [o.ids.numel() for o in outgoing[p]] if outgoing is not None else [0] * num
            header_send += [size if error is None else -1, *counts]
            header_sizes.append(1 + num)
        header_recv_counts = [
            1 + len(self.routes.requests(q, self.rank)) for q in range(self.world)
        ]
        header, _ = exchange(
            torch.tensor(header_send, dtype=HEADER_DTYPE, device=self.device),
            header_sizes,
            header_recv_counts,
        )
        # One host copy: the counts size the next messages (Python split sizes).
        headers = split_list(header.tolist(), header_recv_counts)
        if error is not None:
            raise error
        assert outgoing is not None  # built whenever there was no error
        bad = [q for q, h in enumerate(headers) if h[0] < 0]
        if bad:
            raise ConfigError(
                f"cluster {self.name!r}: rank(s) {bad} rejected their local batch (see their "
                "error: out-of-range IDs or malformed features); no data was exchanged"
            )
        # IDs to the owners.
        id_dtype = self.routes.id_dtype
        # Every peer's IDs in one concatenation (the requests' tensors are already in the ID
        # dtype, so the casts are no-ops).
        parts, sizes = [], []
        for p in range(self.world):
            sent = 0
            for o in outgoing[p]:
                if o.lengths is not None:
                    parts.append(o.lengths.to(id_dtype))
                    sent += o.lengths.numel()
                parts.append(o.ids.to(id_dtype))
                sent += o.ids.numel()
                if self.weighted:
                    parts.append(weights_as_ints(o.weights, o.ids, id_dtype))
                    sent += o.ids.numel()
            sizes.append(sent)
        recv_sizes = []
        for q in range(self.world):
            bags, counts = headers[q][0], headers[q][1:]
            per = [
                (bags if self.pools_at_owner else 0) + n * (2 if self.weighted else 1)
                for n in counts
            ]
            recv_sizes.append(sum(per))
        send = torch.cat(parts) if parts else torch.zeros(0, dtype=id_dtype, device=self.device)
        received, _ = exchange(send, sizes, recv_sizes)
        owned, requests = owned_bags(
            self.routes,
            self.rank,
            len(self.blocks),
            headers,
            list(torch.split(received, recv_sizes)),
            pools=self.pools_at_owner,
            weighted=self.weighted,
            device=self.device,
        )
        return Distributed(
            req_ctx=req_ctx, bags=owned, pieces=requests, batch_sizes=[h[0] for h in headers]
        )

    def _lookup(self, prepared: Distributed, keep: bool) -> _OwnerCtx:
        """The owned blocks' rows (RB: pooled per bag) for the distributed requests."""
        all_bags = prepared.bags
        fused_out, handle = self.fused_store.pooled(
            [all_bags[i] for i in self.fused], keep_for_backward=keep
        )
        synced_out, _ = self.synced_store.pooled(
            [all_bags[i] for i in self.synced], keep_for_backward=False
        )
        pooled: list[torch.Tensor] = [torch.empty(0, device=self.device)] * len(self.blocks)
        for i, out in zip(self.fused + self.synced, fused_out + synced_out, strict=True):
            pooled[i] = out
        return _OwnerCtx(
            pieces=prepared.pieces,
            bags=all_bags,
            handle=handle,
            pooled=pooled,
            batch_sizes=prepared.batch_sizes,
        )

    def _piece_payloads(self, ctx: _OwnerCtx) -> list[list[torch.Tensor]]:
        """Encode each block once, then cut it per requester and request: ``uint8 [rows,
        row_bytes]``."""
        assert ctx.pooled is not None
        encoded = []
        for pooled in ctx.pooled:
            payload, count = encode_rows(pooled, self.forward_codec)
            self.nonfinite += int(count)
            encoded.append(payload)
        ctx.pooled = None
        cursor = [0] * len(self.blocks)
        out = []
        for q in range(self.world):
            mine = []
            for piece in ctx.pieces[q]:
                mine.append(
                    encoded[piece.local][
                        cursor[piece.local] : cursor[piece.local] + piece.num_rows
                    ]
                )
                cursor[piece.local] += piece.num_rows
            out.append(mine)
        return out

    def send_rows(self, payloads: list[list[torch.Tensor]], recv_sizes: list[int]) -> torch.Tensor:
        """Owners send each request's encoded rows; returns the bytes this rank receives."""
        sizes = [sum(t.numel() for t in per) for per in payloads]
        chunks = [t.reshape(-1) for per in payloads for t in per]
        send = (
            torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8, device=self.device)
        )
        received, _ = self.exchange(send, sizes, recv_sizes)
        return received

    # ----------------------------------------------------------------- backward
    def start_backward(self, ctx: Any, grads: list[torch.Tensor], *, lane: Lane) -> Pending[None]:
        """Encode the gradients here; send them to the owners, decode and update there on
        ``lane``."""
        owner_ctx, req_ctx = ctx
        encoded = self.encode_grads(req_ctx, grads)
        return lane.start(lambda: self.update_owners(owner_ctx, encoded), inputs=encoded)

    def update_owners(self, owner_ctx: _OwnerCtx, encoded: tuple[torch.Tensor, list[int]]) -> None:
        """The owners' side of backward: the gradient exchange, the syncs, the updates."""
        full = self.grads_to_owners(owner_ctx, encoded)
        self.fused_store.backward_pooled(
            owner_ctx.handle,
            [owner_ctx.bags[i] for i in self.fused],
            [full[i] for i in self.fused],
        )
        if self.has_sync or self.has_column_sync:
            combined = {i: row_grads(owner_ctx.bags[i], full[i]) for i in self.synced}
            if self.has_sync:
                combined |= replica_sync(
                    self.routes,
                    self.rank,
                    self.exchange,
                    combined,
                    self.replicated,
                    device=self.device,
                )
            means = (
                column_sync(
                    self.routes,
                    self.rank,
                    self.exchange,
                    combined,
                    self.column_split,
                    device=self.device,
                )
                if self.has_column_sync
                else {}
            )
            self.synced_store.apply_row_grads(
                [combined[i][0] for i in self.synced],
                [combined[i][1] for i in self.synced],
                [means.get(i) for i in self.synced],
            )

    def grads_to_owners(
        self, owner_ctx: _OwnerCtx, encoded: tuple[torch.Tensor, list[int]]
    ) -> list[torch.Tensor]:
        """Requesters send each request its gradient rows (``encoded``: the send buffer and
        its split sizes, from :meth:`encode_grads`); owners decode one ``[bags, width]`` per
        block."""
        codec = self.backward_codec
        send, sizes = encoded
        recv_sizes = [
            sum(
                piece.num_rows * codec.row_bytes(self.blocks[piece.local].width)
                for piece in owner_ctx.pieces[q]
            )
            for q in range(self.world)
        ]
        received, _ = self.exchange(send, sizes, recv_sizes)
        block_grads: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for q, data in enumerate(torch.split(received, recv_sizes)):
            start = 0
            for piece in owner_ctx.pieces[q]:
                width = self.blocks[piece.local].width
                nbytes = piece.num_rows * codec.row_bytes(width)
                payload = data[start : start + nbytes].reshape(
                    piece.num_rows, codec.row_bytes(width)
                )
                block_grads[piece.local].append(decode_rows(payload, codec, width))
                start += nbytes
        return [
            torch.cat(g) if g else torch.zeros(0, b.width, device=self.device)
            for g, b in zip(block_grads, self.blocks, strict=True)
        ]

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
