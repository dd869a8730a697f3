"""Towers at setup: where they come from (the module's torchrec tower collections, or the
strategy's ``towers`` option) and which tower modules a module can take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, TowerModule, TowerRequest, names
from lightning_embark.sharding._discovery import Collection, configs_of
from lightning_embark.torchrec_modules import (
    ShardedEmbeddingTowerCollection,
    output_width,
    tower_tables,
)


def planned_towers(
    collections: Mapping[str, Collection],
    option: int | str | Sequence[TowerRequest] | None,
) -> int | str | list[TowerRequest] | None:
    """The towers the automatic plan makes: one per ``EmbeddingTower`` of the module's
    tower collections, else the strategy's option (``"auto"``: the planner decides,
    between flat and identity towers, :func:`~lightning_embark.planner.choose_towers`).

    Raises:
        ConfigError: the module has tower collections and the option asks for other
            towers (a count or requests; ``"auto"`` takes the module's).
    """
    requests = collection_towers(collections)
    if requests:
        if option is not None and option != "auto":
            raise ConfigError(
                "the module has torchrec EmbeddingTowerCollection(s), whose towers are planned "
                "as they are; drop EmbarkStrategy(towers=...)"
            )
        return requests
    if isinstance(option, str) and option != "auto":
        raise ConfigError(f"towers={option!r}: a string option is 'auto' or a towers.json path")
    return option if option is None or isinstance(option, int | str) else list(option)


def collection_towers(collections: Mapping[str, Collection]) -> list[TowerRequest]:
    """One tower request per ``EmbeddingTower`` of the module's tower collections: its
    tables, its interaction module (``custom``) and that module's output width."""
    requests = []
    for path, collection in collections.items():
        if not isinstance(collection, EmbeddingTowerCollection):
            continue
        for i, (tower, tables) in enumerate(
            zip(collection.towers, tower_tables(collection), strict=True)
        ):
            requests.append(
                TowerRequest(
                    name=f"{path.replace('.', '_')}_{i}",  # module names take no dots
                    tables=tuple(names.plan_name(c) for c in tables),
                    module=TowerModule.CUSTOM,
                    output_dim=output_width(tower.interaction, tables),
                )
            )
    return requests


def check_tower_modules(plan: Plan, collections: Mapping[str, Collection]) -> None:
    """Compressing towers only over tower collections: a plain collection's model reads
    per-feature embeddings, which such a tower replaces by its output."""
    in_towers = {
        t
        for c in collections.values()
        if isinstance(c, EmbeddingTowerCollection | ShardedEmbeddingTowerCollection)
        for t in (names.plan_name(x) for x in configs_of(c))
    }
    wrong = [
        t.name
        for t in plan.towers
        if t.module is not TowerModule.IDENTITY and not set(t.tables) <= in_towers
    ]
    if wrong:
        raise ConfigError(
            f"the plan's towers {wrong} have compressing tower modules but their tables are in "
            "a plain EmbeddingBagCollection, whose model reads per-feature embeddings; make them "
            "'identity', or build the model with torchrec's EmbeddingTowerCollection"
        )
