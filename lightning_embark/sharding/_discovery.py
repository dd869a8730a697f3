"""Finding the embedding collections of a LightningModule and describing their tables.

The strategy must work for any module holding torchrec ``EmbeddingBagCollection`` s,
not only :class:`~lightning_embark.models.DLRMModule`: a module that implements
``embedding_modules()`` (the :class:`~lightning_embark.models.ShardableModule`
protocol) names its collections itself; any other module is scanned. The tables are
then described as a :class:`ModelSpec` (the planner's input), with pooling factors
and unique ratios measured on a sample batch when one is at hand, because which
cluster type wins depends on them (docs/architecture.md#embedding-clusters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.embedding_tower import EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.errors import ConfigError
from lightning_embark.plan.names import plan_name
from lightning_embark.spec import ModelSpec
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection, tower_tables

#: A module the strategy shards, or one it already sharded (a
#: ``ShardedEmbeddingTowerCollection`` is a ``ShardedEmbeddingBagCollection``).
Collection: TypeAlias = (
    EmbeddingBagCollection | EmbeddingTowerCollection | ShardedEmbeddingBagCollection
)
_SHARDABLE = (EmbeddingBagCollection, EmbeddingTowerCollection, ShardedEmbeddingBagCollection)


def find_embedding_collections(module: nn.Module) -> dict[str, Collection]:
    """Path -> embedding collection, from ``embedding_modules()`` or by scanning.

    Already sharded collections (the engine's) are returned too, so that a module a
    previous fit sharded can be validated or tested again. A torchrec
    ``EmbeddingTowerCollection`` is one collection (its towers' collections are not
    returned apart): it is sharded with towers.

    Raises:
        ConfigError: no collection, or one the engine cannot execute: a torchrec
            ``EmbeddingCollection`` (sequence embeddings; the message says so), a
            module torchrec already sharded, or anything else.
    """
    name = type(module).__name__
    declared = getattr(module, "embedding_modules", None)
    if callable(declared):
        found: dict[str, nn.Module] = dict(declared())
    else:
        found = {
            path: child
            for path, child in module.named_modules()
            if isinstance(child, (*_SHARDABLE, EmbeddingCollection, ShardedModule))
        }
        towers = [p for p, c in found.items() if isinstance(c, EmbeddingTowerCollection)]
        found = {p: c for p, c in found.items() if not any(p.startswith(f"{t}.") for t in towers)}
    if not found:
        raise ConfigError(
            f"{name} has no torchrec EmbeddingBagCollection for strategy='embark' to shard; "
            "add one to the module (or return it from embedding_modules()), or train with "
            "strategy='ddp'"
        )
    for path, child in found.items():
        if not isinstance(child, _SHARDABLE):
            raise ConfigError(_refusal(f"{name}.{path}", child))
    return found


def _refusal(where: str, child: nn.Module) -> str:
    """Why the engine cannot take ``child``, and what to do instead.

    A sequence collection and a module torchrec already sharded are different
    mistakes with different fixes, so each gets its own message.
    """
    kind = type(child).__name__
    if isinstance(child, EmbeddingCollection):
        return (
            f"{where} is a torchrec EmbeddingCollection (sequence embeddings: one vector per "
            "ID, not pooled); strategy='embark' does not support sequence embeddings, it shards "
            "EmbeddingBagCollections (pooled lookups) only. Use an EmbeddingBagCollection with "
            "pooled features (SUM or MEAN), or train this model with strategy='torchrec'"
        )
    if isinstance(child, ShardedModule):
        return (
            f"{where} is a {kind} from {type(child).__module__}: a module another strategy "
            "(torchrec's DistributedModelParallel) has already sharded; strategy='embark' "
            "shards unsharded torchrec EmbeddingBagCollections, so build the module afresh "
            "with an EmbeddingBagCollection and fit it with strategy='embark' only"
        )
    return (
        f"{where} is a {kind}, not a torchrec EmbeddingBagCollection; strategy='embark' shards "
        "EmbeddingBagCollections (pooled lookups) only, so return only those from "
        "embedding_modules()"
    )


def replace_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at ``path`` (dotted, as in ``named_modules()``) inside ``root``."""
    parent_path, _, leaf = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, leaf, new)


def configs_of(collection: Collection) -> list[EmbeddingBagConfig]:
    """A collection's table configs (a tower collection's: tower by tower)."""
    if isinstance(collection, EmbeddingTowerCollection):
        return [c for tower in tower_tables(collection) for c in tower]
    return list(collection.embedding_bag_configs())


def table_configs(collections: Mapping[str, Collection]) -> list[EmbeddingBagConfig]:
    """Every table config, in collection order.

    Raises:
        ConfigError: two collections share a table or feature name (one plan names
            every table once).
    """
    configs = [c for collection in collections.values() for c in configs_of(collection)]
    for what, names in (
        ("table", [c.name for c in configs]),
        ("feature", [f for c in configs for f in c.feature_names]),
    ):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"{what} names {duplicates} appear in more than one embedding collection; one "
                f"plan covers all collections, so give every {what} a unique name"
            )
    return configs


@dataclass(frozen=True, kw_only=True)
class TableStats:
    """What a sample batch says about one table.

    Attributes:
        pooling_factor: Mean IDs per sample, over all features reading the table.
        unique_ratio: Distinct IDs / IDs in the batch, in (0, 1] (None: no IDs seen).
    """

    pooling_factor: float
    unique_ratio: float | None


def sample_stats(
    configs: Iterable[EmbeddingBagConfig], features: KeyedJaggedTensor
) -> dict[str, TableStats]:
    """Per-table statistics of one rank's batch, keyed by
    :func:`~lightning_embark.plan.names.plan_name`.

    A UB cluster de-duplicates per table, so the ratio pools every feature that
    reads the table.
    """
    by_key = features.to_dict()
    size = max(1, features.stride())
    stats = {}
    for config in configs:
        present = [by_key[f].values() for f in config.feature_names if f in by_key]
        ids = torch.cat(present) if present else torch.zeros(0, dtype=torch.int64)
        ratio = torch.unique(ids).numel() / ids.numel() if ids.numel() else None
        stats[plan_name(config)] = TableStats(
            pooling_factor=ids.numel() / size, unique_ratio=ratio
        )
    return stats


def find_sparse_features(batch: Any) -> KeyedJaggedTensor | None:
    """The ``KeyedJaggedTensor`` inside a batch (torchrec ``Batch``, tuple, list or dict)."""
    if isinstance(batch, KeyedJaggedTensor):
        return batch
    sparse = getattr(batch, "sparse_features", None)
    if isinstance(sparse, KeyedJaggedTensor):
        return sparse
    items = (
        batch.values()
        if isinstance(batch, Mapping)
        else batch
        if isinstance(batch, (list, tuple))
        else ()
    )
    for item in items:
        if isinstance(item, KeyedJaggedTensor):
            return item
    return None


def spec_of(
    configs: Iterable[EmbeddingBagConfig],
    *,
    stats: Mapping[str, TableStats] | None = None,
    reference: ModelSpec | None = None,
) -> ModelSpec:
    """The tables as a :class:`ModelSpec` named for planning.

    Pooling factors come from ``stats`` (measured), else from ``reference`` (e.g. the
    ``spec`` a :class:`~lightning_embark.models.DLRMModule` was built from), else 1.
    """
    configs = list(configs)
    factors = {t.name: t.pooling_factor for t in reference.tables} if reference is not None else {}
    for name, measured in (stats or {}).items():
        if measured.pooling_factor > 0:
            factors[name] = measured.pooling_factor
    return ModelSpec.from_configs(
        configs,
        name=reference.name if reference is not None else "module",
        names=[plan_name(c) for c in configs],
        pooling_factors=factors,
    )
