"""torchrec's module types, executed by the engine: what a user's model holds.

* :class:`ShardedEmbeddingBagCollection`: a drop-in ``EmbeddingBagCollection``
  (``KeyedJaggedTensor`` in, ``KeyedTensor`` out) over
  :class:`~lightning_embark.engine.EmbeddingEngine`.
* :class:`ShardedEmbeddingTowerCollection`: a drop-in ``EmbeddingTowerCollection``,
  each ``EmbeddingTower`` a tower of the plan with its interaction module
  (:class:`KeyedInteraction`) as the tower module.

The engine itself imports no torchrec; this package is where torchrec's types meet it.
"""

from lightning_embark.torchrec_modules._collection import ShardedEmbeddingBagCollection
from lightning_embark.torchrec_modules._tower_collection import (
    KeyedInteraction,
    ShardedEmbeddingTowerCollection,
    output_width,
    tower_tables,
)

__all__ = [
    "KeyedInteraction",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingTowerCollection",
    "output_width",
    "tower_tables",
]
