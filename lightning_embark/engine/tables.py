"""torchrec table configs as the engine sees them, and the plan restricted to them.

A plan names tables by the spec's names (``"f0"``); torchrec configs built from a
spec are called ``"t_f0"`` and read feature ``"f0"``. :func:`plan_table_name`
accepts any of the three, so plans written for a spec apply to its torchrec model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

from lightning_embark.engine.plan import Plan
from lightning_embark.engine.routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec, TableSpec


def plan_table_name(config: EmbeddingBagConfig, plan: Plan) -> str:
    """The plan's name for a torchrec table: its own name, without ``t_``, or its feature's."""
    planned = {t.table for t in plan.tables}
    candidates = [config.name, config.name.removeprefix("t_"), *config.feature_names[:1]]
    for name in candidates:
        if name in planned:
            return name
    raise ConfigError(
        f"table {config.name!r} (features {config.feature_names}) is missing from the plan; "
        f"add a layout named one of {candidates}"
    )


def tables_of(
    configs: Sequence[EmbeddingBagConfig], plan: Plan
) -> tuple[list[TableInfo], list[FeatureInfo], Plan]:
    """Engine view of torchrec configs, and the plan restricted to them (validated)."""
    tables, features, layouts = [], [], []
    for config in configs:
        name = plan_table_name(config, plan)
        layout = plan.layout(name)
        tables.append(TableInfo(name=name, num_rows=config.num_embeddings, dim=config.embedding_dim, layout=layout))
        layouts.append(layout)
        if config.pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise ConfigError(f"table {config.name!r}: pooling {config.pooling} is not supported; use SUM or MEAN")
        pooling = "mean" if config.pooling == PoolingType.MEAN else "sum"
        features += [FeatureInfo(name=f, table=name, pooling=pooling) for f in config.feature_names]
    sub = dataclasses.replace(plan, tables=tuple(layouts))
    spec = ModelSpec(
        name="sharded",
        tables=tuple(TableSpec(name=t.name, num_embeddings=t.num_rows, embedding_dim=t.dim, pooling_factor=1.0)
                     for t in tables),
    )
    sub.validate(spec)
    return tables, features, sub


def build_routes(
    tables: list[TableInfo], features: list[FeatureInfo], plan: Plan
) -> list[tuple[ClusterRoutes, list[int]]]:
    """Per plan cluster with tables here: its routes and its features' model positions."""
    out = []
    for cluster in plan.clusters:
        mine = [t for t in tables if t.layout.cluster == cluster.name]
        if not mine:
            continue
        names = {t.name for t in mine}
        positions = [i for i, f in enumerate(features) if f.table in names]
        routes = ClusterRoutes(cluster, mine, [features[i] for i in positions], plan.world_size)
        out.append((routes, positions))
    return out
