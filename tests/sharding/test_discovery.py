"""find_embedding_collections: what strategy='embark' refuses, and that each refusal says why."""

from __future__ import annotations

import pytest
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from lightning_embark.errors import ConfigError
from lightning_embark.sharding import find_embedding_collections


class _TorchrecSharded(ShardedModule):
    """The smallest torchrec ShardedModule: what DistributedModelParallel leaves in a model."""

    def __init__(self) -> None:
        super().__init__()

    def create_context(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def input_dist(self, ctx, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def compute(self, ctx, dist_input):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def output_dist(self, ctx, output):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    @property
    def unsharded_module_type(self) -> type[nn.Module]:
        return EmbeddingBagCollection


class _Holder(nn.Module):
    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.sparse = child


class _Declaring(_Holder):
    def embedding_modules(self) -> dict[str, nn.Module]:
        return {"sparse": self.sparse}


def _sequence() -> EmbeddingCollection:
    config = EmbeddingConfig(name="t_x", embedding_dim=4, num_embeddings=10, feature_names=["x"])
    return EmbeddingCollection(tables=[config])


@pytest.mark.parametrize("holder", [_Holder, _Declaring])
def test_an_embedding_collection_is_refused_as_sequence_embeddings(holder: type) -> None:
    with pytest.raises(ConfigError) as info:
        find_embedding_collections(holder(_sequence()))
    message = str(info.value)
    assert f"{holder.__name__}.sparse is a torchrec EmbeddingCollection" in message
    assert "does not support sequence embeddings" in message
    assert "Use an EmbeddingBagCollection with pooled features" in message
    assert "strategy='torchrec'" in message
    assert "another strategy" not in message


@pytest.mark.parametrize("holder", [_Holder, _Declaring])
def test_a_module_torchrec_sharded_is_named_as_such(holder: type) -> None:
    with pytest.raises(ConfigError) as info:
        find_embedding_collections(holder(_TorchrecSharded()))
    message = str(info.value)
    assert "is a _TorchrecSharded from" in message
    assert "another strategy (torchrec's DistributedModelParallel) has already sharded" in message
    assert "sequence" not in message


def test_another_declared_module_is_named_without_guessing() -> None:
    with pytest.raises(ConfigError) as info:
        find_embedding_collections(_Declaring(nn.Linear(2, 2)))
    message = str(info.value)
    assert "_Declaring.sparse is a Linear, not a torchrec EmbeddingBagCollection" in message
    assert "another strategy" not in message and "sequence" not in message


def test_bag_collections_are_found() -> None:
    config = EmbeddingBagConfig(
        name="t_x", embedding_dim=4, num_embeddings=10, feature_names=["x"]
    )
    bags = EmbeddingBagCollection(tables=[config])
    assert find_embedding_collections(_Holder(bags)) == {"sparse": bags}
