"""The engine's tables, and the plan restricted to them.

:class:`TableConfig` is what the engine needs of a table, without torchrec (whose
``EmbeddingBagConfig`` the torchrec modules turn into it). Tables are matched to the
plan's layouts by :func:`lightning_embark.plan.names.resolve`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, names, restrict
from lightning_embark.spec import ModelSpec

#: Poolings the engine computes (torchrec's ``PoolingType.SUM`` and ``MEAN``).
POOLINGS = ("sum", "mean")


@dataclass(frozen=True, kw_only=True)
class TableConfig:
    """One embedding table: torchrec's ``EmbeddingBagConfig`` fields the engine reads.

    Attributes:
        name: The table's name (the plan may name it so, or by its first feature).
        num_embeddings: Rows.
        embedding_dim: Columns.
        feature_names: The features that look it up (each pooled on its own).
        pooling: ``"sum"`` or ``"mean"`` over a bag.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ConfigError(
                f"table {self.name!r}: pooling {self.pooling!r} is not supported; use one of "
                f"{list(POOLINGS)}"
            )
        if self.num_embeddings < 1 or self.embedding_dim < 1:
            raise ConfigError(
                f"table {self.name!r} must have at least one row and one column, got "
                f"{self.num_embeddings} x {self.embedding_dim}"
            )
        if not self.feature_names:
            raise ConfigError(f"table {self.name!r} has no features; name at least one")
        object.__setattr__(self, "feature_names", tuple(self.feature_names))


def table_config(config: Any) -> TableConfig:
    """``config`` as a :class:`TableConfig`: itself, or the fields of torchrec's
    ``EmbeddingBagConfig`` (read by name, so the engine never imports torchrec; its
    ``PoolingType`` becomes the member's lower-case name).

    Raises:
        ConfigError: a pooling the engine does not compute (torchrec's ``NONE``).
    """
    if isinstance(config, TableConfig):
        return config
    pooling = config.pooling
    return TableConfig(
        name=config.name,
        num_embeddings=config.num_embeddings,
        embedding_dim=config.embedding_dim,
        feature_names=tuple(config.feature_names),
        pooling=str(getattr(pooling, "name", pooling)).lower(),
    )


def tables_of(
    configs: Sequence[Any], plan: Plan
) -> tuple[list[TableInfo], list[FeatureInfo], Plan]:
    """Engine view of the tables (:class:`TableConfig` or torchrec's configs, see
    :func:`table_config`), and the plan restricted to them (validated)."""
    converted = [table_config(c) for c in configs]
    tables: list[TableInfo] = []
    features: list[FeatureInfo] = []
    planned = [t.table for t in plan.tables]
    for config in converted:
        name = names.resolve(config, planned)
        tables.append(
            TableInfo(
                name=name,
                num_rows=config.num_embeddings,
                dim=config.embedding_dim,
                layout=plan.layout(name),
            )
        )
        features += [
            FeatureInfo(name=f, table=name, pooling=config.pooling) for f in config.feature_names
        ]
    sub = restrict(plan, [t.name for t in tables])
    sub.validate(ModelSpec.from_configs(converted, name="sharded", names=[t.name for t in tables]))
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
