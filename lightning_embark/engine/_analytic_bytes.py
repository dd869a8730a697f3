"""Analytic bytes per step of the sharded module, per rank, split intra-/inter-host.

The same numbers the byte counter (``lightning_embark.accounting``) measures, derived from
the plan and the global batch alone, so the cost model can be checked against the
engine and a benchmark's measurement against its expectation. Per cluster:

* RB / UB forward: header (``8 * (1 + requests)`` bytes to every peer), IDs
  (RB: ``B`` lengths + ``n`` IDs [+ ``n`` weights] per request; UB: ``n`` unique IDs)
  in the ID dtype, then codec rows back (RB: ``B`` pooled rows per request; UB: one
  per unique ID) at ``row_bytes(width)`` each.
* RB / UB backward: the same rows of gradients with the backward codec; for
  replicated tables a header (8 bytes per block pair) and ``[id | fp32 row]`` per
  unique row to every replica peer; for row-wise Adagrad on column-split tables an
  fp32 sum of squares per unique row to every column peer.
* DP backward: one ring all-reduce of the cluster's dense fp32 gradients
  (``2 (W-1)/W`` of the buffer, to the next rank).

A hierarchical exchange sends each stage-1 peer ``8 * hosts`` bytes of counts per
call, forwards rows inside the host, and sends across hosts only between ranks with
the same local rank. RB's pooled rows and gradients then take ``HostReduce``
instead: every owner's partials go to the forwarder inside its host, and one
vector per (feature, column shard) and host crosses hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_embark.engine._batch import jagged_of
from lightning_embark.engine._link_bytes import LinkBytes, StepBytes, link
from lightning_embark.engine._optimizer import OptimizerKind
from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine._tables import build_routes, tables_of
from lightning_embark.engine._tower_bytes import tower_bytes, tower_parameters
from lightning_embark.engine.clusters._host_reduce import reduce_keys
from lightning_embark.plan import ClusterType, Plan
from lightning_embark.wire import codec_for

Matrix = list[list[int]]


def analytic_bytes(
    plan: Plan,
    tables: Sequence[Any],
    batches: Sequence[Any],
    *,
    is_weighted: bool = False,
    optimizer: OptimizerKind | str = OptimizerKind.SGD,
    tower_params: Mapping[str, int] | None = None,
) -> list[StepBytes]:
    """Bytes each rank sends in one forward and one backward of the sharded module.

    Args:
        plan: The plan the module executes.
        tables: The module's tables (:class:`~lightning_embark.engine.TableConfig` or
            torchrec's ``EmbeddingBagConfig``).
        batches: Every rank's local batch, in rank order (a ``KeyedJaggedTensor`` or a
            mapping of feature name to :class:`~lightning_embark.engine.FeatureBatch`).
        is_weighted: Whether the module is weighted (RB sends weights with IDs).
        optimizer: The sparse optimizer kind (row-wise Adagrad adds a column sync).
        tower_params: Parameters of each tower module (built-in kinds are counted when
            absent); towers' parts are keyed ``towers:ids``, ``towers:outputs``,
            ``towers:modules`` and by their inner clusters (:mod:`._tower_bytes`).

    Returns:
        One :class:`StepBytes` per rank.
    """
    infos, features, plan = tables_of(list(tables), plan)
    world, local = plan.world_size, plan.ranks_per_host
    per_key = [jagged_of(b) for b in batches]
    rowwise = OptimizerKind(optimizer) is OptimizerKind.ROWWISE_ADAGRAD
    zero = [LinkBytes() for _ in range(world)]
    forward, backward = list(zero), list(zero)
    by_cluster: list[dict[str, tuple[LinkBytes, LinkBytes]]] = [{} for _ in range(world)]
    for routes, _ in build_routes(infos, features, plan):
        if routes.cluster.type is ClusterType.DP:
            fwd, bwd = list(zero), _dp_backward(routes, world, local)
        else:
            fwd, bwd = _exchanged(routes, per_key, is_weighted, rowwise, local)
        for r in range(world):
            forward[r] += fwd[r]
            backward[r] += bwd[r]
            by_cluster[r][routes.cluster.name] = (fwd[r], bwd[r])
    if plan.towers:
        parts = tower_bytes(
            plan,
            infos,
            features,
            list(tables),
            per_key,
            weighted=is_weighted,
            status_on_world=not any(
                r.cluster.type is not ClusterType.DP
                for r, _ in build_routes(infos, features, plan)
            ),
            parameters=tower_parameters(
                plan, features, {t.name: t.dim for t in infos}, tower_params
            ),
            inner=lambda sub, configs, sub_batches: analytic_bytes(
                sub, configs, sub_batches, is_weighted=is_weighted, optimizer=optimizer
            ),
        )
        for name, (fwd, bwd) in parts.items():
            for r in range(world):
                forward[r] += fwd[r]
                backward[r] += bwd[r]
                by_cluster[r][name] = (fwd[r], bwd[r])
    return [
        StepBytes(forward=f, backward=b, by_cluster=c)
        for f, b, c in zip(forward, backward, by_cluster, strict=False)
    ]


def _dp_backward(routes: ClusterRoutes, world: int, local: int) -> list[LinkBytes]:
    buffer = 4 * sum(t.num_rows * t.dim for t in routes.tables)
    sent = round(2.0 * (world - 1) * buffer / world) if world > 1 else 0
    return [link(r, (r + 1) % world, sent, local) for r in range(world)]


def _exchanged(
    routes: ClusterRoutes, per_key: list[dict], weighted: bool, rowwise: bool, local: int
) -> tuple[list[LinkBytes], list[LinkBytes]]:
    world = routes.world_size
    cluster = routes.cluster
    ub = cluster.type is ClusterType.UB
    fwd_codec = codec_for(cluster.forward_compression, backward=False)
    bwd_codec = codec_for(cluster.backward_compression, backward=True)
    id_size = routes.id_dtype.itemsize
    ids = [
        _shard_ids(routes, per_key[q], ub) for q in range(world)
    ]  # [q][slot][row shard] -> local ids
    sizes = [_batch_size(per_key[q], routes) for q in range(world)]

    def requests(q: int, p: int) -> list[tuple[int, int, int]]:  # (ids sent, rows answered, width)
        out = []
        for r in routes.requests(q, p):
            n = ids[q][r.slot][r.block.row_shard].numel()
            out.append((n, n if ub else sizes[q], r.block.width))
        return out

    header = [[8 * (1 + len(routes.requests(q, p))) for p in range(world)] for q in range(world)]
    per_id = 1 if ub else (2 if weighted else 1)
    id_msgs = [
        [
            id_size * sum((0 if ub else rows) + n * per_id for n, rows, _ in requests(q, p))
            for p in range(world)
        ]
        for q in range(world)
    ]
    rows_back = [
        [sum(rows * fwd_codec.row_bytes(w) for _, rows, w in requests(q, p)) for q in range(world)]
        for p in range(world)
    ]
    grads = [
        [sum(rows * bwd_codec.row_bytes(w) for _, rows, w in requests(q, p)) for p in range(world)]
        for q in range(world)
    ]
    hierarchical = cluster.hierarchical and local < world
    if hierarchical and local > 1 and not ub:  # RB rows and gradients take HostReduce
        rows_links = _host_reduce(routes, sizes, local, fwd_codec.row_bytes, backward=False)
        grad_links = _host_reduce(routes, sizes, local, bwd_codec.row_bytes, backward=True)
    else:
        rows_links = _exchange(rows_back, hierarchical, local)
        grad_links = _exchange(grads, hierarchical, local)
    fwd = _sum_links(
        [
            _exchange(header, hierarchical, local),
            _exchange(id_msgs, hierarchical, local),
            rows_links,
        ]
    )
    bwd_links = [grad_links]
    bwd_mats = []
    if any(t.layout.num_replicas > 1 for t in routes.tables):
        union = _block_rows(routes, ids, all_replicas=False)
        bwd_mats.append(
            [[8 * len(routes.sync_pairs(a, b)) for b in range(world)] for a in range(world)]
        )
        bwd_mats.append(
            [
                [
                    sum(
                        union[(a, s)] * (id_size + 4 * routes.blocks[a][s].width)
                        for s, _ in routes.sync_pairs(a, b)
                    )
                    for b in range(world)
                ]
                for a in range(world)
            ]
        )
    if rowwise and any(t.layout.num_col_shards > 1 for t in routes.tables):
        combined = _block_rows(routes, ids, all_replicas=True)
        bwd_mats.append(
            [
                [
                    sum(4 * combined[(a, s)] for s, _ in routes.column_pairs(a, b))
                    for b in range(world)
                ]
                for a in range(world)
            ]
        )
    bwd = _sum_links(bwd_links + [_exchange(m, hierarchical, local) for m in bwd_mats])
    return fwd, bwd


def _host_reduce(
    routes: ClusterRoutes,
    sizes: list[int],
    local: int,
    row_bytes: Callable[[int], int],
    *,
    backward: bool,
) -> list[LinkBytes]:
    """Bytes of :class:`HostReduce`: owners -> forwarder inside the host, one vector per key
    across hosts."""
    world = routes.world_size
    hosts = world // local
    out = [LinkBytes() for _ in range(world)]
    for q in range(world):
        for owner in range(world):
            forwarder = owner // local * local + q % local
            inside = sum(sizes[q] * row_bytes(r.block.width) for r in routes.requests(q, owner))
            # forward: owner -> forwarder; backward: forwarder -> owner (same bytes, other sender)
            src, dst = (forwarder, owner) if backward else (owner, forwarder)
            out[src] += link(src, dst, inside, local)
        for host in range(hosts):
            forwarder = host * local + q % local
            across = sum(
                sizes[q] * row_bytes(r.block.width) for _, r in reduce_keys(routes, q, host, local)
            )
            src, dst = (q, forwarder) if backward else (forwarder, q)
            out[src] += link(src, dst, across, local)
    return out


def _batch_size(jagged: dict, routes: ClusterRoutes) -> int:
    first = jagged[routes.features[0].name]
    return first[1].numel()


def _shard_ids(routes: ClusterRoutes, jagged: dict, ub: bool) -> list[list[torch.Tensor]]:
    """Per slot, per row shard: the local row ids a requester sends."""
    out = []
    for slot, t in enumerate(routes.slot_table):
        table = routes.tables[t]
        if ub:
            names = [
                f.name
                for f, ft in zip(routes.features, routes.feature_table, strict=False)
                if ft == t
            ]
            values = torch.unique(torch.cat([jagged[n][0].to(torch.int64) for n in names]))
        else:
            values = jagged[routes.features[slot].name][0].to(torch.int64)
        shard, local = table.split(values)
        out.append([local[shard == i] for i in range(table.layout.num_row_shards)])
    return out


def _block_rows(
    routes: ClusterRoutes, ids: list, *, all_replicas: bool
) -> dict[tuple[int, int], int]:
    """Unique rows an owner's block updates: over its replica's requesters (or all requesters)."""
    out = {}
    for owner in range(routes.world_size):
        for local, block in enumerate(routes.blocks[owner]):
            seen = []
            for q in range(routes.world_size):
                if all_replicas or routes.replica(block.table, q) == block.replica:
                    seen += [
                        ids[q][s][block.row_shard]
                        for s, t in enumerate(routes.slot_table)
                        if t == block.table
                    ]
            out[(owner, local)] = torch.unique(torch.cat(seen)).numel() if seen else 0
    return out


def _exchange(sends: Matrix, hierarchical: bool, local: int) -> list[LinkBytes]:
    """Bytes per rank for one exchange call with ``sends[src][dst]`` bytes."""
    world = len(sends)
    if not hierarchical:
        return [
            sum((link(q, p, sends[q][p], local) for p in range(world)), LinkBytes())
            for q in range(world)
        ]
    hosts = world // local
    out = []
    for rank in range(world):
        host, me = divmod(rank, local)
        intra = sum(
            8 * hosts + sum(sends[rank][h * local + peer] for h in range(hosts))
            for peer in range(local)
            if peer != me
        )
        inter = sum(
            sends[host * local + src][h * local + me]
            for h in range(hosts)
            if h != host
            for src in range(local)
        )
        out.append(LinkBytes(intra=intra, inter=inter))
    return out


def _sum_links(parts: Sequence[list[LinkBytes]]) -> list[LinkBytes]:
    """Per rank, the sum of several exchanges' per-rank bytes."""
    return [sum(column, LinkBytes()) for column in zip(*parts, strict=True)]
