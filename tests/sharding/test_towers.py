"""Where the automatic plan's towers come from: the module's torchrec tower collections,
else the strategy's ``towers`` option."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedTensor

from lightning_embark.errors import ConfigError
from lightning_embark.plan import TowerModule, TowerRequest
from lightning_embark.sharding._towers import planned_towers


def _ebc(*names: str) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=n, embedding_dim=4, num_embeddings=10, feature_names=[n])
            for n in names
        ]
    )


class Projection(nn.Module):
    """A tower's interaction: a linear map of its KeyedTensor's values."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2)

    def forward(self, embeddings: KeyedTensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(embeddings.values())
        return out


def _etc() -> EmbeddingTowerCollection:
    return EmbeddingTowerCollection(
        [EmbeddingTower(_ebc("a", "b"), Projection(8)), EmbeddingTower(_ebc("c"), Projection(4))]
    )


def test_a_module_with_tower_collections_plans_their_towers_under_auto_too() -> None:
    """``strategy="embark-towers"`` (towers ``"auto"``) on a model with its own tower
    collection shards that collection as it is, one tower per ``EmbeddingTower``."""
    collections = {"model.towers": _etc()}
    for option in (None, "auto"):
        towers = planned_towers(collections, option)
        assert isinstance(towers, list)
        assert [t.tables for t in towers] == [("a", "b"), ("c",)]
        assert {t.module for t in towers} == {TowerModule.CUSTOM}
        assert [t.output_dim for t in towers] == [2, 2]
    with pytest.raises(ConfigError, match="drop EmbarkStrategy"):
        planned_towers(collections, 2)


def test_a_plain_module_takes_the_option() -> None:
    collections = {"model.ebc": _ebc("a", "b")}
    assert planned_towers(collections, "auto") == "auto"  # the planner decides
    assert planned_towers(collections, None) is None
    given = (TowerRequest(name="t", tables=("a",)),)
    assert planned_towers(collections, given) == list(given)
    with pytest.raises(ConfigError, match=r"'auto' or a towers\.json path"):
        planned_towers(collections, "one")
