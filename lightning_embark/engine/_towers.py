"""Towers (DMT's semantic-preserving tower transform) inside the sharded module.

A tower's tables live on one host. Per step, seen from rank ``q`` (host ``h``, local
rank ``l``) of ``H`` hosts of ``L`` ranks:

1. **IDs across hosts once.** For every host ``g``, ``q`` sends the IDs and bag
   lengths of the features of ``g``'s towers, for its ``B_q`` samples, to rank
   ``(g, l)``: one all-to-all among the same-local-rank peers (the cross-host rail),
   after a header of counts. IDs travel as int32 when every tower table fits.
2. **Lookup inside the host.** Rank ``(h, l)`` now holds the samples of every
   ``(s, l)``, ``V = sum_s B_s`` of them, in host order. Its host's tower tables are
   sharded among the host's ``L`` ranks by ordinary embedding clusters (DP / RB / UB,
   row and column splits, compressed intra-host wire): an inner
   :class:`~lightning_embark.engine.EmbeddingEngine` over the host's
   process group, fed the ``V`` samples.
3. **Tower modules.** Each tower's module maps its features' pooled vectors
   ``[V, D_t]`` to ``[V, O_t]`` (identity: the vectors as they are).
4. **Output back.** The ``[B_s, O_t]`` rows go back to ``(s, l)`` over the same rail,
   encoded with the tower's compression (the kernels' pack / unpack-reduce), one
   all-to-all per distinct compression setting.

Backward mirrors it inside the module's one autograd node: the output gradient
crosses back (backward codec), the tower modules' backward runs
(``torch.autograd.grad``), their parameter gradients are summed over the host's
ranks only (an all-reduce on the host's group: the ranks of a tower's host saw every
sample of the global batch between them), and the inner module's backward updates
the tables at their owners. No other rank ever reads a tower module's parameters, so
they are synchronised nowhere else; :meth:`TowerStage.broadcast_modules` makes every
rank's copy current (checkpoints call it).

Gradient scale: the gradient reaching the sharded module is already the
``1 / W``-scaled one (see :mod:`lightning_embark.sharding`), and a sum over the ``L``
ranks of a host of what its samples contributed is the global batch's gradient, so
nothing here rescales.

With identity tower modules the result equals the flat model's for every sample:
the same rows are pooled, only by other ranks.

What crosses hosts (steps 1 and 4, and the output gradient backward) is
:mod:`._tower_exchange`'s; this module builds the stage, runs the lookup and the tower
modules, and keeps the tower modules' parameters in sync.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from lightning_embark._traffic import traffic
from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._routing import FeatureInfo, TableInfo
from lightning_embark.engine._tower_exchange import TowerExchange, TowerView, starts
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import hierarchy_groups
from lightning_embark.plan import Plan, TowerModule, host_plan


class InnerEngine(Protocol):
    """What the stage asks of the inner module over its host's group: the engine's forward
    and backward on a batch already laid out (a :class:`~lightning_embark.engine.EmbeddingEngine`;
    typed by its use so the stage does not import the engine that builds it)."""

    def _run_forward(
        self, batch: JaggedBatch, error: Any, *, keep: bool
    ) -> tuple[torch.Tensor, Any]: ...

    def _run_backward(self, states: Any, grad: torch.Tensor) -> None: ...


@dataclass(frozen=True, kw_only=True)
class _Context:
    sizes: list[int]  # batch size of every cross-host peer (source host order)
    inner: Any  # the inner module's backward states, or None
    towers: list[tuple[torch.Tensor, torch.Tensor] | None]  # (input, output) per host tower


class TowerStage:
    """The towers of one sharded module, executed on this rank (see the module docstring).

    Args:
        plan: The module's plan (with towers).
        features: The module's features, in model order.
        tables: The module's tables (plan names, shapes, layouts).
        rank: This rank in ``group``.
        group: The module's process group (the plan's ranks).
        inner: The inner module over this host's process group for its towers'
            tables, or None when no tower lives on this host.
        modules: Tower name -> its module, for every non-identity tower.
        weighted: Whether features carry per-sample weights.
        status_on_world: Whether the header must reach every rank (no flat cluster
            exchanges before the towers, so a bad batch is announced here).
        device: The engine's device (batches, buffers and tower modules live there).
    """

    def __init__(
        self,
        *,
        plan: Plan,
        features: Sequence[FeatureInfo],
        tables: Sequence[TableInfo],
        rank: int,
        group: Any,
        inner: InnerEngine | None,
        modules: Mapping[str, nn.Module],
        weighted: bool,
        status_on_world: bool,
        device: torch.device,
    ) -> None:
        self.rank = rank
        self.device = device
        self.local_size = plan.ranks_per_host
        self.hosts = plan.num_hosts
        self.host = rank // self.local_size
        self.host_group, rail_group = hierarchy_groups(self.local_size, group)
        self.group = group
        self.inner = inner
        self.modules = dict(modules)
        dims = {t.name: t.dim for t in tables}
        # Per host: the model positions of its towers' features, in model order (the
        # order of the inner module's features on that host).
        self.host_positions: list[list[int]] = [[] for _ in range(self.hosts)]
        host_of = {t: tower.host for tower in plan.towers for t in tower.tables}
        for i, f in enumerate(features):
            if f.table in host_of:
                self.host_positions[host_of[f.table]].append(i)
        self.towers: list[TowerView] = []
        out_offset, host_offsets = 0, [0] * self.hosts
        for tower in plan.towers:
            positions = tuple(
                i for i in self.host_positions[tower.host] if features[i].table in tower.tables
            )
            feature_dims = tuple(dims[features[i].table] for i in positions)
            columns = starts([dims[features[i].table] for i in self.host_positions[tower.host]])
            index = {p: k for k, p in enumerate(self.host_positions[tower.host])}
            in_columns = tuple(
                (columns[index[p]], d) for p, d in zip(positions, feature_dims, strict=True)
            )
            out_dim = (
                sum(feature_dims) if tower.module is TowerModule.IDENTITY else tower.output_dim
            )
            assert out_dim is not None
            self.towers.append(
                TowerView(
                    plan=tower,
                    positions=positions,
                    dims=feature_dims,
                    in_columns=in_columns,
                    out_dim=out_dim,
                    out_offset=out_offset,
                    host_offset=host_offsets[tower.host],
                )
            )
            out_offset += out_dim
            host_offsets[tower.host] += out_dim
        self.out_dim = out_offset
        self.mine = [t for t in self.towers if t.plan.host == self.host]
        assert (inner is not None) == bool(self.mine)
        self.exchange = TowerExchange(
            plan=plan,
            towers=self.towers,
            host_positions=self.host_positions,
            tables=tables,
            rank=rank,
            group=group,
            rail_group=rail_group,
            weighted=weighted,
            status_on_world=status_on_world,
            device=device,
        )

    # ----------------------------------------------------------------- forward
    def forward(
        self, batch: Sequence[FeatureBatch], *, keep: bool, error: ConfigError | None
    ) -> tuple[torch.Tensor, _Context | None]:
        """The towers' outputs ``[B, sum(O_t)]`` for this rank's samples (plan tower order)."""
        size = batch[0].batch_size if batch else 0
        sizes, received = self.exchange.ids(batch, size, error)
        host_out, inner_states, towers = self._run_towers(received, sizes, keep)
        out = self.exchange.outputs(host_out, sizes, size)
        ctx = _Context(sizes=sizes, inner=inner_states, towers=towers) if keep else None
        return out, ctx

    def _run_towers(
        self, batch: list[FeatureBatch], sizes: list[int], keep: bool
    ) -> tuple[torch.Tensor, Any, list[tuple[torch.Tensor, torch.Tensor] | None]]:
        """Look this host's tower tables up over the ``V`` samples and run the tower
        modules: ``[V, sum(O_t)]`` over this host's towers."""
        rows = sum(sizes)
        if self.inner is None:
            return torch.zeros(rows, 0, device=self.device), None, []
        inner_batch = JaggedBatch.from_features(batch, rows, self.device)
        pooled, inner_states = self.inner._run_forward(inner_batch, None, keep=keep)
        outputs: list[torch.Tensor] = []
        kept: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for tower in self.mine:
            x = torch.cat([pooled[:, s : s + w] for s, w in tower.in_columns], dim=1)
            module = self.modules.get(tower.plan.name)
            if module is None:
                outputs.append(x)
                kept.append(None)
                continue
            with torch.enable_grad() if keep else torch.no_grad():
                x_in = x.detach().requires_grad_(keep)
                y = module(x_in)
            if tuple(y.shape) != (rows, tower.out_dim):
                raise ConfigError(
                    f"tower {tower.plan.name!r}: its module returned shape {tuple(y.shape)} for "
                    f"{rows} samples, but the plan gives it output_dim={tower.out_dim}; make "
                    "them agree"
                )
            outputs.append(y.detach())
            kept.append((x_in, y) if keep else None)
        return torch.cat(outputs, dim=1), inner_states, kept

    # ----------------------------------------------------------------- backward
    def backward(self, ctx: _Context, grad: torch.Tensor) -> None:
        """Send the towers' output gradient ``[B, sum(O_t)]`` back to the towers' hosts, run
        the tower modules' backward, sum their parameter gradients inside the host and let
        the inner module update the tables."""
        host_grad = self.exchange.output_grads(grad, ctx.sizes)
        if self.inner is None:
            return
        inner_grad = torch.zeros(
            sum(ctx.sizes), sum(w for t in self.mine for _, w in t.in_columns), device=self.device
        )
        params: list[nn.Parameter] = []
        param_grads: list[torch.Tensor] = []
        for tower, kept in zip(self.mine, ctx.towers, strict=True):
            g = host_grad[:, tower.host_offset : tower.host_offset + tower.out_dim]
            if kept is None:
                g_in = g
            else:
                x_in, y = kept
                own = [p for p in self.modules[tower.plan.name].parameters() if p.requires_grad]
                got = torch.autograd.grad(y, [x_in, *own], g, allow_unused=True)
                g_in = got[0] if got[0] is not None else torch.zeros_like(x_in)
                params += own
                param_grads += [
                    pg if pg is not None else torch.zeros_like(p)
                    for p, pg in zip(own, got[1:], strict=True)
                ]
            start = 0
            for s, w in tower.in_columns:
                inner_grad[:, s : s + w] = g_in[:, start : start + w]
                start += w
        self._sum_in_host(params, param_grads)
        self.inner._run_backward(ctx.inner, inner_grad)

    def _sum_in_host(self, params: list[nn.Parameter], grads: list[torch.Tensor]) -> None:
        """Sum this step's tower-module gradients over the host's ranks, then accumulate."""
        if not params:
            return
        if self.local_size > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            with traffic("towers:modules"):
                dist.all_reduce(flat, group=self.host_group)
            grads = [
                chunk.view_as(g)
                for chunk, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)
            ]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.to(p.dtype) if p.grad is None else p.grad + g

    # ----------------------------------------------------------------- module sync
    def broadcast_modules(self) -> None:
        """Give every rank the tower modules' current parameters from their host's first
        rank (collective over the module's group; a checkpoint's rank 0 then saves them)."""
        for tower in self.towers:
            module = self.modules.get(tower.plan.name)
            if module is None:
                continue
            source = tower.plan.host * self.local_size
            with torch.no_grad():
                for tensor in (*module.parameters(), *module.buffers()):
                    dist.broadcast(tensor.data, group_src=source, group=self.group)


def tower_stage(
    *,
    plan: Plan,
    configs: Sequence[Any],
    tables: Sequence[TableInfo],
    features: Sequence[FeatureInfo],
    rank: int,
    group: Any,
    modules: Mapping[str, nn.Module],
    weighted: bool,
    status_on_world: bool,
    device: torch.device,
    inner_engine: Callable[..., InnerEngine],
) -> TowerStage | None:
    """The towers' stage of an engine, with the inner module over this host's group (None:
    the plan has no towers).

    Every rank builds the host and rail groups here, at the same point; only the ranks of a
    host with towers build an inner module (its groups are the host's).

    Args:
        plan: The engine's plan.
        configs: The engine's table configs, in model order (the inner module takes those
            of this host's towers).
        tables: Their plan names, shapes and layouts, in the same order.
        features: The engine's features, in model order.
        rank: This rank in ``group``.
        group: The engine's process group.
        modules: Tower name -> its module, for every non-identity tower.
        weighted: Whether features carry per-sample weights.
        status_on_world: Whether the header must reach every rank (see
            :class:`TowerStage`).
        device: The engine's device.
        inner_engine: Builds the inner module: ``inner_engine(configs, plan,
            process_group=...)`` with the engine's other options bound.
    """
    if not plan.towers:
        return None
    host_group, _ = hierarchy_groups(plan.ranks_per_host, group)
    host = rank // plan.ranks_per_host
    here = {t for tower in plan.towers if tower.host == host for t in tower.tables}
    mine = [c for c, t in zip(configs, tables, strict=True) if t.name in here]
    inner = inner_engine(mine, host_plan(plan, host), process_group=host_group) if mine else None
    return TowerStage(
        plan=plan,
        features=features,
        tables=tables,
        rank=rank,
        group=group,
        inner=inner,
        modules=modules,
        weighted=weighted,
        status_on_world=status_on_world,
        device=device,
    )
