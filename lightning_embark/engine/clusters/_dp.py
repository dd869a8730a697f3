"""Data-parallel clusters: every rank holds whole tables and looks up locally.

No forward traffic; the backward all-reduces one flat buffer of dense gradients for
all the cluster's tables (on the engine's lane), then every replica applies the same
update.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine._batch import FeatureBatch, mean_scale
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._lane import Lane, Pending
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import Cluster, EngineOptions
from lightning_embark.engine.stores import Bags, FlatBags, ShardStore, make_store
from lightning_embark.errors import ConfigError


class DPCluster(Cluster):
    """Data-parallel tables: local lookup, dense gradients all-reduced in one buffer."""

    def __init__(self, routes: ClusterRoutes, rank: int, options: EngineOptions) -> None:
        super().__init__(routes, rank, options)
        self.blocks = routes.blocks[rank]
        for table in routes.tables:
            ranks = table.layout.ranks
            if table.layout.num_replicas != routes.world_size or any(
                ranks[g][0] != g for g in range(len(ranks))
            ):
                raise ConfigError(
                    f"table {table.name!r} is in DP cluster {self.name!r} but replica g is not on "
                    f"rank g (ranks {ranks}); a DP table needs ranks=[[0], [1], ..., "
                    f"[{routes.world_size - 1}]]"
                )
        order = {b.table: i for i, b in enumerate(self.blocks)}
        self._local = [order[t] for t in range(len(routes.tables))]
        self._dims = [routes.tables[t].dim for t in routes.feature_table]
        self._one_feature_per_table = [self._local[t] for t in routes.feature_table] == list(
            range(len(self.blocks))
        )
        self.store: ShardStore = make_store(
            options.store,
            [(b.num_rows, b.width) for b in self.blocks],
            options.optimizer,
            device=self.device,
        )

    @property
    def exchanges(self) -> bool:
        return False

    def _bags(self, batch: list[FeatureBatch]) -> list[Bags]:
        per_table: list[list[FeatureBatch]] = [[] for _ in self.blocks]
        for f, fb in enumerate(batch):
            per_table[self._local[self.routes.feature_table[f]]].append(fb)
        bags = []
        for fbs in per_table:
            offsets = [torch.zeros(1, dtype=torch.int64, device=self.device)]
            for fb in fbs:
                offsets.append(fb.lengths.to(torch.int64).cumsum(0) + offsets[-1][-1])
            weights = [fb.weights for fb in fbs if fb.weights is not None]
            bags.append(
                Bags(
                    indices=torch.cat(
                        [fb.values.to(torch.int64) for fb in fbs]
                        or [torch.zeros(0, dtype=torch.int64, device=self.device)]
                    ),
                    offsets=torch.cat(offsets),
                    weights=torch.cat(weights) if weights else None,
                )
            )
        return bags

    def start_forward(
        self,
        batch: JaggedBatch,
        *,
        keep_for_backward: bool,
        lane: Lane,
        error: ConfigError | None = None,
        prepared: Any = None,
    ) -> tuple[Pending[torch.Tensor], Any]:
        """Local lookups, done here (nothing goes through ``lane``): one kernel call when
        each table is read by one feature, in table order (the batch is then already in
        the kernel's layout)."""
        if error is not None:
            raise error
        features = batch.features()
        if self._one_feature_per_table:
            flat = FlatBags(
                indices=batch.values.to(torch.int64),
                offsets=batch.bag_offsets,
                weights=batch.weights.to(torch.float32) if batch.weights is not None else None,
                num_bags=(batch.batch_size,) * batch.num_features,
                batch=max(1, batch.batch_size),
                id_counts=tuple(batch.counts),
            )
            pooled, _ = self.store.pooled_flat(flat, keep_for_backward=False)
            out = list(torch.split(pooled[: batch.batch_size], self._dims, dim=1))
            bags = self._bags(features)
        else:
            bags = self._bags(features)
            looked_up, _ = self.store.pooled(bags, keep_for_backward=False)
            out, cursor = [], [0] * len(bags)
            for f, fb in enumerate(features):
                local = self._local[self.routes.feature_table[f]]
                out.append(looked_up[local][cursor[local] : cursor[local] + fb.batch_size])
                cursor[local] += fb.batch_size
        for f, fb in enumerate(features):
            if self.routes.features[f].pooling == "mean":
                out[f] = out[f] * mean_scale(fb)
        dense = (
            torch.cat(out, dim=1) if out else torch.zeros(batch.batch_size, 0, device=self.device)
        )
        return Pending.done(dense), (bags, features)

    def start_backward(self, ctx: Any, grad: torch.Tensor, *, lane: Lane) -> Pending[None]:
        """All-reduce every table's dense gradient (one flat buffer), then update the rows
        that got one (the all-reduce and the update on ``lane``).

        Each ID's gradient row (its bag's pooled gradient, times its weight) is added
        straight into its table's view of the flat buffer, in ID order:
        ``dense[r] = 0 + g_1 + g_2 + ...`` over the IDs of row ``r``, the same sums in the
        same order as summing per unique row first and adding those to zeros (an
        accumulator started at +0 never holds -0, so the extra ``0 +`` changed nothing).
        """
        bags, batch = ctx
        grads = list(torch.split(grad, self._dims, dim=1)) if batch else []
        pooled_grads: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        for f, (fb, g) in enumerate(zip(batch, grads, strict=True)):
            if self.routes.features[f].pooling == "mean":
                g = g * mean_scale(fb)
            pooled_grads[self._local[self.routes.feature_table[f]]].append(g)
        sizes = [block.num_rows * block.width for block in self.blocks]
        flat = torch.zeros(sum(sizes), device=self.device)
        dense = [
            part.view(block.num_rows, block.width)
            for part, block in zip(flat.split(sizes), self.blocks, strict=True)
        ]
        for d, b, gs in zip(dense, bags, pooled_grads, strict=True):
            if not gs or b.indices.numel() == 0:
                continue
            pooled = torch.cat(gs) if len(gs) > 1 else gs[0]
            lengths = b.offsets[1:] - b.offsets[:-1]
            bag_of = torch.repeat_interleave(
                torch.arange(b.num_bags, device=lengths.device),
                lengths,
                output_size=b.indices.numel(),
            )
            contrib = pooled[bag_of]
            if b.weights is not None:
                contrib = contrib * b.weights.unsqueeze(1)
            d.index_add_(0, b.indices, contrib)
        return lane.start(lambda: self._update(flat, dense), inputs=flat)

    def _update(self, flat: torch.Tensor, dense: list[torch.Tensor]) -> None:
        """Sum the gradients of every replica (``flat``, whose views ``dense`` are per table)
        and update the rows that got one."""
        dist.all_reduce(flat, group=self.options.group)
        touched_rows: list[torch.Tensor] = []
        updates: list[torch.Tensor] = []
        for full in dense:
            touched = full.ne(0).any(1).nonzero().flatten()
            touched_rows.append(touched)
            updates.append(full[touched])
        self.store.apply_row_grads(touched_rows, updates)

    def local_blocks(self) -> list[tuple[Any, torch.Tensor]]:
        return list(zip(self.blocks, self.store.weights(), strict=True))

    def stores(self) -> list[tuple[ShardStore, list[int]]]:
        return [(self.store, list(range(len(self.blocks))))]
