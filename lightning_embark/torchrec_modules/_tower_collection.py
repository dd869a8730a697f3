"""torchrec's ``EmbeddingTowerCollection`` executed by the engine with towers.

An ``EmbeddingTowerCollection`` is a list of ``EmbeddingTower(embedding_module,
interaction_module)``; its forward returns the towers' interaction outputs
concatenated, ``[B, sum(O_t)]``. :class:`ShardedEmbeddingTowerCollection` is a drop-in
replacement: each ``EmbeddingTower`` is a tower of the plan (matched by its tables),
its ``EmbeddingBagCollection``'s tables are sharded inside the tower's host, and its
interaction module is the tower module, run on that host over the samples of every
host, with only its output crossing hosts (``lightning_embark.engine._towers``). Users
of torchrec's towers switch by changing the Trainer's strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from lightning_embark.engine import EngineConfig, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, TowerModule, names
from lightning_embark.torchrec_modules._collection import ShardedEmbeddingBagCollection


class KeyedInteraction(nn.Module):
    """A torchrec tower's interaction module as a tower module: it takes the tower's
    pooled vectors ``[N, D_t]`` and calls the interaction on them as the
    ``KeyedTensor`` its ``EmbeddingBagCollection`` would have returned.

    Args:
        interaction: The ``EmbeddingTower``'s interaction module.
        keys: Its collection's feature names, in order.
        dims: Their pooled widths.
    """

    def __init__(self, interaction: nn.Module, keys: Sequence[str], dims: Sequence[int]) -> None:
        super().__init__()
        self.interaction = interaction
        self.keys = list(keys)
        self.dims = list(dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.interaction(
            KeyedTensor(keys=self.keys, length_per_key=self.dims, values=x)
        )
        return out


def tower_tables(etc: EmbeddingTowerCollection) -> list[list[EmbeddingBagConfig]]:
    """Each tower's table configs.

    Raises:
        ConfigError: a tower whose embedding module is not an ``EmbeddingBagCollection``.
    """
    out = []
    for i, tower in enumerate(etc.towers):
        if not isinstance(tower.embedding, EmbeddingBagCollection):
            raise ConfigError(
                f"tower {i} of the EmbeddingTowerCollection embeds with a "
                f"{type(tower.embedding).__name__}; the engine shards towers over "
                "EmbeddingBagCollections (pooled lookups) only"
            )
        out.append(list(tower.embedding.embedding_bag_configs()))
    return out


def output_width(interaction: nn.Module, configs: Sequence[EmbeddingBagConfig]) -> int:
    """The width of an interaction module's output, from one all-zero sample."""
    keys = [f for c in configs for f in c.feature_names]
    dims = [c.embedding_dim for c in configs for _ in c.feature_names]
    probe = KeyedInteraction(interaction, keys, dims)
    with torch.no_grad():
        out = probe(torch.zeros(1, sum(dims)))
    if out.dim() != 2 or out.shape[0] != 1:
        raise ConfigError(
            f"a tower's interaction module must return [batch, width], got shape "
            f"{tuple(out.shape)} for one sample"
        )
    return int(out.shape[1])


class ShardedEmbeddingTowerCollection(ShardedEmbeddingBagCollection):
    """An ``EmbeddingTowerCollection`` whose towers are the plan's (module docstring).

    Its forward returns the tensor the unsharded collection returns: the towers'
    outputs concatenated in the collection's tower order.
    """

    _order: list[str]
    _tower_tables: list[list[str]]

    @property
    def unsharded_towers(self) -> list[tuple[str, list[str]]]:
        """Per ``EmbeddingTower`` of the unsharded collection, in its order: the plan tower's
        name and the tower's torchrec table names (what maps this module's state onto the
        unsharded collection's ``towers.<i>`` keys)."""
        return [(n, list(t)) for n, t in zip(self._order, self._tower_tables, strict=True)]

    @classmethod
    def from_etc(
        cls,
        etc: EmbeddingTowerCollection,
        plan: Plan,
        *,
        sparse_optimizer: SparseOptimizer,
        process_group: Any = None,
        config: EngineConfig | None = None,
        device: torch.device | str | None = None,
    ) -> ShardedEmbeddingTowerCollection:
        """Shard ``etc`` by ``plan``, whose towers must hold exactly its towers' tables,
        onto ``device`` (the engine's; None: the CPU). Its interaction modules are moved
        there as the tower modules.

        Raises:
            ConfigError: a tower of ``etc`` matches no tower of the plan, or matches an
                identity one.
        """
        per_tower = tower_tables(etc)
        planned = [t.table for t in plan.tables]
        order, modules, configs, weights = [], {}, [], {}
        for i, (tower, tables) in enumerate(zip(etc.towers, per_tower, strict=True)):
            mine = {names.resolve(c, planned) for c in tables}
            match = next((t for t in plan.towers if set(t.tables) == mine), None)
            if match is None:
                raise ConfigError(
                    f"tower {i} of the EmbeddingTowerCollection (tables {sorted(mine)}) is no "
                    f"tower of the plan (its towers: {[list(t.tables) for t in plan.towers]}); "
                    "plan one tower per EmbeddingTower"
                )
            if match.module is TowerModule.IDENTITY:
                raise ConfigError(
                    f"plan tower {match.name!r} is 'identity' but EmbeddingTower {i} has an "
                    "interaction module; make the plan's tower 'custom' with its output_dim"
                )
            order.append(match.name)
            modules[match.name] = KeyedInteraction(
                tower.interaction.to(device) if device is not None else tower.interaction,
                [f for c in tables for f in c.feature_names],
                [c.embedding_dim for c in tables for _ in c.feature_names],
            )
            configs += tables
            ebc = tower.embedding
            for table in tables:
                weight = ebc.embedding_bags[table.name].weight
                if not weight.is_meta:
                    weights[table.name] = weight.detach()
        weighted = {t.embedding.is_weighted() for t in etc.towers}
        if len(weighted) > 1:
            raise ConfigError(
                "the EmbeddingTowerCollection mixes weighted and unweighted towers; the engine "
                "shards one kind per collection"
            )
        module = cls(
            configs,
            plan,
            sparse_optimizer=sparse_optimizer,
            is_weighted=weighted.pop() if weighted else False,
            process_group=process_group,
            config=config,
            weights=weights,
            tower_modules=modules,
            device=device,
        )
        module._order = order
        module._tower_tables = [[c.name for c in tables] for tables in per_tower]
        return module

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """The towers' outputs ``[B, sum(O_t)]``, in the collection's tower order."""
        out = super().forward(features).to_dict()
        return torch.cat([out[name] for name in self._order], dim=1)
