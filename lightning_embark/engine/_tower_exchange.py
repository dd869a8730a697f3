"""The towers' traffic between hosts (:mod:`._towers`): IDs out to the towers' hosts,
outputs back, output gradients out again.

Kept apart from the stage because it is what crosses hosts: the stage decides what a
tower computes, this module only where its inputs and outputs travel. Every message
goes over the cross-host rail (the all-to-all among the ranks of one local rank ``l``,
one per host). Seen from rank ``q = (h, l)`` of ``H`` hosts:

* **headers** (forward, first): ``[batch size (or -1), IDs per feature]`` to each rail
  peer ``(g, l)`` (``g``'s towers' features), so every rank learns of a bad batch
  before any data moves. With no flat cluster exchanging first, the header goes to
  every rank of the module's group instead, since nothing else would announce it.
* **IDs** (forward): the lengths, IDs (and weights, bit-cast) of the features of
  ``g``'s towers for ``q``'s ``B_q`` samples to ``(g, l)``; IDs travel as int32 when
  every tower table fits.
* **outputs** (forward, last): a tower host's ``[B_s, O_t]`` rows back to each
  ``(s, l)``, encoded with the tower's forward compression (the kernels' pack /
  unpack-reduce), one all-to-all per distinct compression setting.
* **output gradients** (backward, first): the same messages reversed, with each
  tower's backward codec.

Every buffer is made on the engine's device, headers included (the collectives'
device); a received header comes to the host once, as a list, since its counts size
the next messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark._host_work import to_device
from lightning_embark._traffic import traffic
from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._routing import INT32_MAX, TableInfo
from lightning_embark.engine.clusters._grad_sync import HEADER_DTYPE, split_list
from lightning_embark.engine.clusters._owner_requests import ints_as_weights, weights_as_ints
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import FlatAllToAll
from lightning_embark.kernels import ExchangeLayout, RankSlice, pack, unpack_reduce
from lightning_embark.plan import Plan, TowerPlan
from lightning_embark.wire import codec_for


@dataclass(frozen=True, kw_only=True)
class TowerView:
    """One tower as this rank sees it: its plan, features and column offsets (built once
    here; the stage, its exchange and the engine's output slots all read them)."""

    plan: TowerPlan
    positions: tuple[int, ...]  # model feature positions, model order
    dims: tuple[int, ...]  # pooled width of each feature
    in_columns: tuple[tuple[int, int], ...]  # (start, width) of each feature in the host output
    out_dim: int
    out_offset: int  # column of its output in the all-towers output
    host_offset: int  # column of its output in its host's towers' output

    @property
    def in_dim(self) -> int:
        return sum(self.dims)


class TowerExchange:
    """The rail traffic of one rank's tower stage (see the module docstring).

    Args:
        plan: The module's plan (with towers).
        towers: The stage's towers, in plan order.
        host_positions: Per host, the model positions of its towers' features, in
            model order (the order of the inner module's features on that host).
        tables: The module's tables (the ID dtype must hold every tower table's rows).
        rank: This rank in ``group``.
        group: The module's process group (the plan's ranks).
        rail_group: This rank's same-local-rank group (its cross-host rail).
        weighted: Whether features carry per-sample weights.
        status_on_world: Whether the header must reach every rank of ``group``.
        device: The engine's device (every buffer lives there).
    """

    def __init__(
        self,
        *,
        plan: Plan,
        towers: Sequence[TowerView],
        host_positions: Sequence[Sequence[int]],
        tables: Sequence[TableInfo],
        rank: int,
        group: Any,
        rail_group: Any,
        weighted: bool,
        status_on_world: bool,
        device: torch.device,
    ) -> None:
        self.device = device
        self.local_size = plan.ranks_per_host
        self.hosts = plan.num_hosts
        self.world = plan.world_size
        self.host, self.local = divmod(rank, self.local_size)
        self.host_positions = [list(p) for p in host_positions]
        self.weighted = weighted
        self.status_on_world = status_on_world
        tower_tables = {t for tower in plan.towers for t in tower.tables}
        self.id_dtype = (
            torch.int32
            if max((t.num_rows for t in tables if t.name in tower_tables), default=0) <= INT32_MAX
            else torch.int64
        )
        self.out_dim = sum(t.out_dim for t in towers)
        self.host_out_dim = [
            sum(t.out_dim for t in towers if t.plan.host == g) for g in range(self.hosts)
        ]
        codecs: dict[tuple[str, str], list[TowerView]] = {}
        for t in towers:
            codecs.setdefault(
                (t.plan.forward_compression, t.plan.backward_compression), []
            ).append(t)
        self.codec_groups = list(codecs.items())
        self.rail = FlatAllToAll(rail_group)
        self.header_exchange = FlatAllToAll(group) if status_on_world else self.rail
        self._layouts: dict[tuple[int, ...], list[tuple[ExchangeLayout, ExchangeLayout]]] = {}

    # ----------------------------------------------------------------- IDs
    def ids(
        self, batch: Sequence[FeatureBatch], size: int, error: ConfigError | None
    ) -> tuple[list[int], list[FeatureBatch]]:
        """Send every host its towers' IDs (raise first if any rank's batch is bad).

        Returns:
            The batch size of every rail peer (source host order), and this host's
            towers' features over the ``V`` samples that arrived (sources in host order).
        """
        with traffic("towers:ids"):
            counts = self._exchange_headers(batch, size, error)
            return [c[0] for c in counts], self._exchange_ids(batch, counts)

    def _exchange_headers(
        self, batch: Sequence[FeatureBatch], size: int, error: ConfigError | None
    ) -> list[list[int]]:
        """Swap ``[batch size (or -1), IDs per feature]`` with the rail peers; raise on a bad
        batch anywhere (every rank learns of it here, or in an earlier flat cluster).

        Returns the rail peers' headers, on the host (they size the next messages)."""
        status = size if error is None else -1
        send, send_counts = [], []
        peers = range(self.world) if self.status_on_world else range(self.hosts)
        for p in peers:
            host = self._rail_host(p)
            values = (
                []
                if host is None or error is not None
                else [batch[i].values.numel() for i in self.host_positions[host]]
            )
            if host is not None and error is not None:
                values = [0] * len(self.host_positions[host])
            header = to_device([status, *values], dtype=HEADER_DTYPE, device=self.device)
            send.append(header)
            send_counts.append(header.numel())
        recv_counts = [
            1 + (len(self.host_positions[self.host]) if self._rail_host(p) is not None else 0)
            for p in peers
        ]
        received, _ = self.header_exchange(torch.cat(send), send_counts, recv_counts)
        headers = split_list(received.tolist(), recv_counts)
        if error is not None:
            raise error
        bad = [p for p, h in zip(peers, headers, strict=True) if h[0] < 0]
        if bad:
            raise ConfigError(
                f"towers: rank(s) {bad} rejected their local batch (see their error: "
                "out-of-range IDs or malformed features); no data was exchanged"
            )
        if self.status_on_world:
            headers = [
                h for p, h in zip(peers, headers, strict=True) if self._rail_host(p) is not None
            ]
        return headers

    def _rail_host(self, peer: int) -> int | None:
        """The host of header peer ``peer`` when it is a rail peer, else None."""
        if not self.status_on_world:
            return peer
        host, local = divmod(peer, self.local_size)
        return host if local == self.local else None

    def _exchange_ids(
        self, batch: Sequence[FeatureBatch], headers: list[list[int]]
    ) -> list[FeatureBatch]:
        """Send every host its towers' IDs; return this host's features over the ``V``
        samples that arrived (sources in host order)."""
        per = 2 if self.weighted else 1
        pieces, send_counts = [], []
        for host in range(self.hosts):
            parts: list[torch.Tensor] = []
            for i in self.host_positions[host]:
                fb = batch[i]
                parts += [fb.lengths.to(self.id_dtype), fb.values.to(self.id_dtype)]
                if self.weighted:
                    parts.append(weights_as_ints(fb.weights, fb.values, self.id_dtype))
            sent = (
                torch.cat(parts)
                if parts
                else torch.zeros(0, dtype=self.id_dtype, device=self.device)
            )
            pieces.append(sent)
            send_counts.append(sent.numel())
        recv_counts = [h[0] * len(h[1:]) + per * sum(h[1:]) for h in headers]
        received, _ = self.rail(torch.cat(pieces), send_counts, recv_counts)
        features: list[list[FeatureBatch]] = [[] for _ in self.host_positions[self.host]]
        for h, chunk in zip(headers, torch.split(received, recv_counts), strict=True):
            bags, offset = h[0], 0
            for k, n in enumerate(h[1:]):
                lengths = chunk[offset : offset + bags].to(torch.int64)
                values = chunk[offset + bags : offset + bags + n].to(torch.int64)
                offset += bags + n
                weights = None
                if self.weighted:
                    weights = ints_as_weights(chunk[offset : offset + n])
                    offset += n
                features[k].append(FeatureBatch(values=values, lengths=lengths, weights=weights))
        return [
            FeatureBatch(
                values=torch.cat([p.values for p in parts]),
                lengths=torch.cat([p.lengths for p in parts]),
                weights=torch.cat([p.weights for p in parts if p.weights is not None])
                if self.weighted
                else None,
            )
            for parts in features
        ]

    # ----------------------------------------------------------------- outputs
    def outputs(self, host_out: torch.Tensor, sizes: list[int], size: int) -> torch.Tensor:
        """This host's towers' outputs ``[V, .]`` to the ranks whose samples they are;
        returns this rank's ``[B, sum(O_t)]`` (plan tower order)."""
        with traffic("towers:outputs"):
            dense = padded(host_out, max(1, self.host_out_dim[self.host]))
            out = torch.zeros(size, max(1, self.out_dim), device=self.device)
            for ((fwd, _), _), (send, recv) in zip(
                self.codec_groups, self._layout_pairs(sizes, size), strict=True
            ):
                codec = codec_for(fwd, backward=False)
                payload, _ = pack(dense, send, codec)
                received, _ = self.rail(payload, send.split_bytes(codec), recv.split_bytes(codec))
                out += unpack_reduce(received, recv, codec)
            return out[:, : self.out_dim]

    def output_grads(self, grad: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """This rank's output gradient ``[B, sum(O_t)]`` to the towers' hosts; returns this
        host's towers' output gradient ``[V, max(1, sum(O_t))]`` (sources in host order)."""
        size = grad.shape[0]
        dense = padded(grad.contiguous(), max(1, self.out_dim))
        host_grad = torch.zeros(
            sum(sizes), max(1, self.host_out_dim[self.host]), device=self.device
        )
        for ((_, bwd), _), (send, recv) in zip(
            self.codec_groups, self._layout_pairs(sizes, size), strict=True
        ):
            codec = codec_for(bwd, backward=True)
            payload, _ = pack(dense, recv, codec)
            with traffic("towers:outputs"):
                received, _ = self.rail(payload, recv.split_bytes(codec), send.split_bytes(codec))
            host_grad += unpack_reduce(received, send, codec)
        return host_grad

    def _layout_pairs(
        self, sizes: list[int], size: int
    ) -> list[tuple[ExchangeLayout, ExchangeLayout]]:
        """Per compression group: (send layout over this host's ``[V, .]`` output, receive
        layout into this rank's ``[B, sum(O_t)]``)."""
        key = (*sizes, size)
        if key not in self._layouts:
            if len(self._layouts) >= 16:  # batch sizes seen are few; stay bounded
                self._layouts.clear()
            row_starts = starts(sizes)
            pairs = []
            for _, towers in self.codec_groups:
                mine = [(t.host_offset, t.out_dim) for t in towers if t.plan.host == self.host]
                send = ExchangeLayout(
                    ranks=tuple(
                        RankSlice(row_start=s, row_stop=s + n, blocks=tuple(mine))
                        for s, n in zip(row_starts, sizes, strict=True)
                    ),
                    num_rows=sum(sizes),
                    num_cols=max(1, self.host_out_dim[self.host]),
                )
                recv = ExchangeLayout(
                    ranks=tuple(
                        RankSlice(
                            row_start=0,
                            row_stop=size,
                            blocks=tuple(
                                (t.out_offset, t.out_dim) for t in towers if t.plan.host == g
                            ),
                        )
                        for g in range(self.hosts)
                    ),
                    num_rows=size,
                    num_cols=max(1, self.out_dim),
                )
                pairs.append((send, recv))
            self._layouts[key] = pairs
        return self._layouts[key]


def starts(sizes: Sequence[int]) -> list[int]:
    """The start of each of consecutive pieces of lengths ``sizes`` (rows or columns)."""
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out


def padded(x: torch.Tensor, cols: int) -> torch.Tensor:
    """``x`` with at least ``cols`` columns (layouts need one column even when empty)."""
    if x.shape[1] >= cols:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], cols - x.shape[1])], dim=1)
