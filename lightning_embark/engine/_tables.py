"""torchrec table configs as the engine sees them, and the plan restricted to them.

Tables are matched to the plan's layouts by :func:`lightning_embark.plan.names.resolve`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, names, restrict
from lightning_embark.spec import ModelSpec


def tables_of(
    configs: Sequence[EmbeddingBagConfig], plan: Plan
) -> tuple[list[TableInfo], list[FeatureInfo], Plan]:
    """Engine view of torchrec configs, and the plan restricted to them (validated)."""
    tables, features, layouts = [], [], []
    planned = [t.table for t in plan.tables]
    for config in configs:
        name = names.resolve(config, planned)
        layout = plan.layout(name)
        tables.append(
            TableInfo(
                name=name, num_rows=config.num_embeddings, dim=config.embedding_dim, layout=layout
            )
        )
        layouts.append(layout)
        if config.pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise ConfigError(
                f"table {config.name!r}: pooling {config.pooling} is not supported; use SUM or "
                "MEAN"
            )
        pooling = "mean" if config.pooling == PoolingType.MEAN else "sum"
        features += [
            FeatureInfo(name=f, table=name, pooling=pooling) for f in config.feature_names
        ]
    sub = restrict(plan, [t.name for t in tables])
    sub.validate(ModelSpec.from_configs(configs, name="sharded", names=[t.name for t in tables]))
    return tables, features, sub


def build_routes(
    tables: list[TableInfo], features: list[FeatureInfo], plan: Plan
) -> list[tuple[ClusterRoutes, list[int]]]:
    """Per plan cluster with flat tables here: its routes and its features' model positions.

    Tables in towers are left out: the tower stage (:mod:`._towers`) runs them.
    """
    out = []
    for cluster in plan.clusters:
        mine = [
            t for t in tables if t.layout.cluster == cluster.name and plan.tower_of(t.name) is None
        ]
        if not mine:
            continue
        here = {t.name for t in mine}
        positions = [i for i, f in enumerate(features) if f.table in here]
        routes = ClusterRoutes(cluster, mine, [features[i] for i in positions], plan.world_size)
        out.append((routes, positions))
    return out
