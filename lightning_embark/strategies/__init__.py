"""The Lightning strategies: thin shells over :mod:`lightning_embark.sharding` and
:mod:`lightning_embark.baseline`.

* :class:`EmbarkStrategy` (``strategy="embark"``): the EMBark engine.
* :class:`TorchrecStrategy` (``strategy="torchrec"``, ``"torchrec-fp16"``): torchrec's
  ``DistributedModelParallel`` with its own planner, the baseline.

Both derive from :class:`ShardingStrategy`, which holds what they share.
"""

from lightning_embark.strategies._base import ShardingStrategy
from lightning_embark.strategies._embark import EmbarkStrategy
from lightning_embark.strategies._torchrec import TorchrecStrategy

__all__ = ["EmbarkStrategy", "ShardingStrategy", "TorchrecStrategy"]
