"""A scenario with towers for exactness checks: every cluster type inside a tower.

:func:`towers_plan` puts two towers and flat tables into one plan on ``H`` hosts of
``L`` ranks: tower ``t0`` on host 0 holds an RB table row-split over the host, a UB
table column-split over it and a DP table replicated on it; tower ``t1`` on the last
host holds an RB table (mean pooling) on one rank and a UB table read by two features,
range-split over the host. Two flat tables (RB row-wise over the world, DP) stay
outside the towers. On one host both towers share it; with more than two hosts the
middle hosts hold no tower. :func:`tower_reference` is the unsharded model the sharded
one must equal: one ``EmbeddingBagCollection`` and the towers' modules applied to their
features' pooled vectors. :func:`four_table_towers_plan` is a small identity-tower plan
over the four tables ``f0``-``f3`` of the Trainer-level tests.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TowerModule,
    TowerPlan,
    layouts,
)
from lightning_embark.testing._scenarios import Scenario

DIM = 8


def towers_plan(
    world_size: int,
    ranks_per_host: int,
    *,
    module: TowerModule | str = TowerModule.IDENTITY,
    output_dim: int | None = None,
    compression: Compression | str = Compression.FP32,
    hierarchical: bool = False,
) -> Scenario:
    """Two towers (first and last host) and two flat tables; see the module docstring.

    Args:
        world_size: ``H * L``.
        ranks_per_host: ``L``.
        module: Both towers' module kind.
        output_dim: Both towers' output width (non-identity modules).
        compression: Wire format of the towers' outputs and of their clusters.
        hierarchical: Whether the flat RB cluster exchanges hierarchically.
    """
    local = ranks_per_host
    hosts = world_size // local
    last = hosts - 1
    host0 = list(range(local))
    host_last = list(range(last * local, hosts * local))
    columns = host0[:2] if local > 1 else host0
    specs: list[tuple[str, int, PoolingType, list[str] | None]] = [
        ("a", 23, PoolingType.SUM, None),
        ("b", 17, PoolingType.SUM, None),
        ("c", 9, PoolingType.SUM, None),
        ("d", 20, PoolingType.MEAN, None),
        ("g", 26, PoolingType.SUM, ["g1", "g2"]),
        ("e", 29, PoolingType.SUM, None),
        ("f", 7, PoolingType.MEAN, None),
    ]
    tables = [
        EmbeddingBagConfig(
            name=f"t_{n}",
            num_embeddings=rows,
            embedding_dim=DIM,
            feature_names=features or [n],
            pooling=pool,
        )
        for n, rows, pool, features in specs
    ]
    wire = Compression(compression)
    clusters: tuple[ClusterPlan, ...] = (
        ClusterPlan(
            name="t0rb", type=ClusterType.RB, forward_compression=wire, backward_compression=wire
        ),
        ClusterPlan(
            name="t0ub", type=ClusterType.UB, forward_compression=wire, backward_compression=wire
        ),
        ClusterPlan(name="t0dp", type=ClusterType.DP),
        ClusterPlan(
            name="t1rb", type=ClusterType.RB, forward_compression=wire, backward_compression=wire
        ),
        ClusterPlan(
            name="t1ub", type=ClusterType.UB, forward_compression=wire, backward_compression=wire
        ),
        ClusterPlan(name="flat", type=ClusterType.RB, hierarchical=hierarchical),
        ClusterPlan(name="flatdp", type=ClusterType.DP),
    )
    if hosts == 1:  # both towers on the one host: their clusters may be shared
        clusters = tuple(c for c in clusters if c.name not in ("t1rb", "t1ub"))
    t1 = "t0" if hosts == 1 else "t1"
    plan_layouts = (
        layouts.row_wise("a", "t0rb", host0),
        layouts.column_wise("b", "t0ub", columns),
        layouts.host_data_parallel("c", "t0dp", 0, local),
        layouts.table_wise("d", f"{t1}rb", host_last[-1]),
        layouts.row_wise("g", f"{t1}ub", host_last, RowSplit.RANGE),
        layouts.row_wise("e", "flat", range(world_size)),
        layouts.data_parallel("f", "flatdp", world_size),
    )
    kind = TowerModule(module)
    towers = (
        TowerPlan(
            name="t0",
            host=0,
            tables=("a", "b", "c"),
            module=kind,
            output_dim=output_dim,
            forward_compression=wire,
            backward_compression=wire,
        ),
        TowerPlan(
            name="t1",
            host=last,
            tables=("d", "g"),
            module=kind,
            output_dim=output_dim,
            forward_compression=wire,
            backward_compression=wire,
        ),
    )
    plan = Plan(
        world_size=world_size,
        ranks_per_host=local,
        clusters=clusters,
        tables=plan_layouts,
        towers=towers,
    )
    return Scenario(tables=tables, plan=plan)


def tower_reference(
    ebc: EmbeddingBagCollection,
    plan: Plan,
    modules: Mapping[str, nn.Module],
    features: KeyedJaggedTensor,
) -> tuple[list[str], torch.Tensor]:
    """The unsharded towered model's output keys and ``[N, .]`` values for ``features``.

    Flat features (and the features of identity towers) keep their pooled vectors in
    model order; each non-identity tower's module sees its features' pooled vectors
    concatenated in model order, and its output follows, in plan order.
    """
    pooled = ebc(features).to_dict()
    table_of = {
        f: c.name.removeprefix("t_") for c in ebc.embedding_bag_configs() for f in c.feature_names
    }
    hidden = {t.name: t for t in plan.towers if t.module is not TowerModule.IDENTITY}
    keys, parts = [], []
    for feature in features.keys():  # noqa: SIM118 (a KJT, not a dict)
        tower = plan.tower_of(table_of[feature])
        if tower is None or tower.name not in hidden:
            keys.append(feature)
            parts.append(pooled[feature])
    for tower in plan.towers:
        if tower.name in hidden:
            inputs = [pooled[f] for f in features.keys() if table_of[f] in tower.tables]  # noqa: SIM118
            keys.append(tower.name)
            parts.append(modules[tower.name](torch.cat(inputs, dim=1)))
    return keys, torch.cat(parts, dim=1)


def four_table_towers_plan(world: int, local: int) -> Plan:
    """Identity towers over tables ``f0``-``f3`` on ``world // local`` hosts of ``local``
    ranks: tower ``first`` on host 0 (``f0`` on one rank in RB, ``f2`` row-split over
    the host in UB), tower ``last`` on the last host (``f1`` column-split in RB), ``f3``
    a flat DP table."""
    last = world // local - 1
    first, final = list(range(local)), list(range(last * local, world))
    return Plan(
        world_size=world,
        ranks_per_host=local,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="h0rb", type=ClusterType.RB),
            ClusterPlan(name="h0ub", type=ClusterType.UB),
            ClusterPlan(name="hlrb", type=ClusterType.RB),
        ),
        tables=(
            layouts.table_wise("f0", "h0rb", 0),
            layouts.column_wise("f1", "hlrb", final),
            layouts.row_wise("f2", "h0ub", first),
            layouts.data_parallel("f3", "dp", world),
        ),
        towers=(
            TowerPlan(name="first", host=0, tables=("f0", "f2")),
            TowerPlan(name="last", host=last, tables=("f1",)),
        ),
    )
