"""What a sharding strategy needs from a LightningModule.

A strategy that shards embeddings (``strategy="torchrec"`` now, ``"embark"`` later)
must find the embedding collections to shard and the optimizer to fuse into them,
without knowing the model class. Any LightningModule that implements this protocol
can be trained with those strategies; :class:`~lightning_embark.models.DLRMModule`
does.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn

from lightning_embark.models._optimizers import SparseOptimizerSpec


@runtime_checkable
class ShardableModule(Protocol):
    """A module whose embedding collections a strategy may shard.

    Contract:
        * ``embedding_modules()`` maps each embedding collection's fully qualified
          path in the module (as in ``named_modules()``) to the collection. Before
          sharding the values are torchrec ``EmbeddingBagCollection`` s, possibly on
          the ``meta`` device; after sharding, the sharded modules at the same paths.
        * ``sparse_optimizer_spec()`` describes the embedding optimizer. The strategy
          attaches it to the embedding parameters with
          ``torch.distributed.optim._apply_optimizer_in_backward`` before sharding,
          so torchrec fuses it into the TBE backward; ``configure_optimizers`` must
          then leave out parameters that carry ``_in_backward_optimizers``.
        * A strategy that shards sets ``shards_embeddings = True`` on itself; a module
          that defers embedding allocation (``meta`` device) materializes the tables
          in ``configure_model`` only when the trainer's strategy does not.
    """

    def embedding_modules(self) -> dict[str, nn.Module]:
        """Path -> embedding collection, for every collection to shard."""
        ...

    def sparse_optimizer_spec(self) -> SparseOptimizerSpec:
        """The optimizer of the embedding parameters."""
        ...
