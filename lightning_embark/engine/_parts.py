"""What an :class:`~lightning_embark.engine.EmbeddingEngine` is built of, made in one place.

The engine's constructor checks the launch and the plan, then composes, in this order:
the engine's view of the tables (:func:`~._tables.tables_of`), the groups it owns (the
lane's twin group with ``overlap``, the input pipeline's with ``pipeline``), one cluster
per plan cluster with flat tables here (:func:`~.clusters.make_cluster`), the input
pipeline's hand-over, the lane, the tower modules and tower stage, and the output
layout. :func:`build_parts` does that and returns the parts; the engine keeps them and
runs the step over them. Collective where it makes groups (every rank of the group
builds its engine at the same point).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightning_embark.engine._ahead import AheadDistribution
from lightning_embark.engine._checks import twin_group
from lightning_embark.engine._config import EngineConfig
from lightning_embark.engine._lane import Lane
from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine._outputs import OutputLayout, Slot, output_slots
from lightning_embark.engine._routing import FeatureInfo, TableInfo
from lightning_embark.engine._tables import TableConfig, build_routes, tables_of
from lightning_embark.engine._tower_modules import tower_modules as _tower_modules
from lightning_embark.engine._towers import InnerEngine, TowerStage, tower_stage
from lightning_embark.engine.clusters import make_cluster
from lightning_embark.engine.clusters._base import Cluster, EngineOptions
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan


@dataclass(kw_only=True)
class EngineParts:
    """An engine's parts, as :func:`build_parts` made them.

    Attributes:
        tables: The engine's view of the tables, in config order.
        features: Every feature, in model order.
        plan: The plan restricted to these tables (validated).
        group: The group the engine's collectives run on (its own with ``overlap``).
        own_groups: Groups made for this engine (destroyed by its ``release``).
        rank: This rank in ``group``.
        clusters: Each cluster with its features' model positions, in plan order.
        ahead: The input pipeline's hand-over (None: no pipeline, or nothing to send
            ahead).
        lane: The worker the clusters' exchanges run on (inline without ``overlap``).
        feature_dims: Each feature's width, in model order.
        towers: Tower name -> module for the non-identity towers.
        stage: The tower stage (None: no towers in the plan).
        outputs: ``(key, width, source)`` per output column group.
        layout: How the clusters' and towers' outputs make the engine's output.
        feature_rows: Each feature's table rows, for the ID range check.
    """

    tables: list[TableInfo]
    features: list[FeatureInfo]
    plan: Plan
    group: Any
    own_groups: list[Any]
    rank: int
    clusters: list[tuple[Cluster, list[int]]]
    ahead: AheadDistribution | None
    lane: Lane
    feature_dims: list[int]
    towers: dict[str, nn.Module]
    stage: TowerStage | None
    outputs: list[Slot]
    layout: OutputLayout
    feature_rows: torch.Tensor


def build_parts(
    configs: Sequence[TableConfig],
    plan: Plan,
    *,
    sparse_optimizer: SparseOptimizer,
    is_weighted: bool,
    process_group: Any,
    config: EngineConfig,
    tower_modules: Mapping[str, nn.Module] | None,
    device: torch.device,
    inner_engine: Callable[..., InnerEngine],
) -> EngineParts:
    """The parts of an engine over ``configs`` sharded by ``plan`` (see the module
    docstring for the order); the arguments are the engine's own, ``inner_engine`` builds
    the module a rank runs for its host's towers.

    Raises:
        ConfigError: the plan is for another world size or other tables, or weighted
            features use mean pooling.
    """
    assert dist.is_initialized(), "the engine checks torch.distributed first"
    world = dist.get_world_size(process_group)
    if plan.world_size != world:
        raise ConfigError(
            f"plan is for {plan.world_size} ranks but the process group has {world}; re-plan"
        )
    tables, features, plan = tables_of(list(configs), plan)
    if is_weighted and any(f.pooling == "mean" for f in features):
        raise ConfigError(
            "weighted features need SUM pooling (torch's mean pooling takes no weights)"
        )
    own_groups: list[Any] = []
    if config.overlap:
        # The lane issues the engine's collectives from its worker, and the last
        # backward's run past the step: no other module may share the group.
        process_group = twin_group(process_group)
        own_groups.append(process_group)
    rank = dist.get_rank(process_group)
    options = EngineOptions(
        optimizer=sparse_optimizer,
        store=config.store,
        group=process_group,
        ranks_per_host=plan.ranks_per_host,
        weighted=is_weighted,
        device=device,
        input_group=twin_group(process_group) if config.pipeline else None,
    )
    if options.input_group is not None:
        own_groups.append(options.input_group)
    clusters: list[tuple[Cluster, list[int]]] = [
        (make_cluster(routes, rank, options), positions)
        for routes, positions in build_routes(tables, features, plan)
    ]
    ahead = (
        AheadDistribution(clusters, device, rank)
        if config.pipeline and any(c.distributes_input for c, _ in clusters)
        else None
    )
    names = [t.name for t in tables]
    feature_dims = [tables[names.index(f.table)].dim for f in features]
    towers = _tower_modules(plan, tables, features, tower_modules, device=device)
    stage = tower_stage(
        plan=plan,
        configs=list(configs),
        tables=tables,
        features=features,
        rank=rank,
        group=process_group,
        modules=dict(towers),
        weighted=is_weighted,
        status_on_world=not any(c.exchanges for c, _ in clusters),
        device=device,
        inner_engine=inner_engine,
    )
    outputs = output_slots(features, feature_dims, stage.towers if stage is not None else [])
    layout = OutputLayout(
        outputs,
        [positions for _, positions in clusters],
        feature_dims,
        stage.out_dim if stage is not None else 0,
        device,
    )
    rows = {t.name: t.num_rows for t in tables}
    return EngineParts(
        tables=tables,
        features=features,
        plan=plan,
        group=process_group,
        own_groups=own_groups,
        rank=rank,
        clusters=clusters,
        ahead=ahead,
        lane=Lane(device, overlap=config.overlap),
        feature_dims=feature_dims,
        towers=dict(towers),
        stage=stage,
        outputs=outputs,
        layout=layout,
        feature_rows=torch.tensor(
            [rows[f.table] for f in features], dtype=torch.int64, device=device
        ),
    )
