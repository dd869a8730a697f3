"""The strategy's side of the input pipeline: each training batch prefetched as it is fetched.

Lightning's data fetcher takes batch ``i + 1`` from the dataloader before step ``i`` runs
(to know whether ``i`` is the last). :class:`PrefetchingLoader` wraps the training
dataloader so that taking a batch also starts its input distribution in every sharded
collection (:meth:`~lightning_embark.engine.EmbeddingEngine.prefetch`): the IDs of batch
``i + 1`` travel while step ``i`` computes, and step ``i + 1``'s lookup finds them there.

A collection matches its prefetch by the batch's ``KeyedJaggedTensor`` (its ``values()``
tensor), so the batch's features are moved to the engine's device here, before Lightning's
own transfer, which then has nothing left to move for them. A model that rebuilds the
``KeyedJaggedTensor`` before the lookup gains nothing (its lookups distribute their input
themselves, as without a pipeline; the engine warns once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.sharding._discovery import find_sparse_features
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection


class PrefetchingLoader:
    """A dataloader whose batches start their input distribution as they are taken.

    Everything but iteration is the wrapped loader's (length, sampler, dataset), so
    Lightning treats it as the loader itself.

    Args:
        loader: The training dataloader.
        prefetch: Called with each batch taken while ``active()``; returns the batch to
            hand on (its features moved to the engine's device).
        active: Whether batches are being taken for training now (the fit loop; not a
            sanity check or validation).
    """

    def __init__(
        self, loader: Any, prefetch: Callable[[Any], Any], active: Callable[[], bool]
    ) -> None:
        self.loader = loader
        self._prefetch = prefetch
        self._active = active

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield self._prefetch(batch) if self._active() else batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def prefetch_batch(
    batch: Any, collections: Mapping[str, ShardedEmbeddingBagCollection], device: torch.device
) -> Any:
    """``batch`` with its features on ``device``, after starting their input distribution
    in every pipelined collection that reads them.

    The batch's first ``KeyedJaggedTensor`` (as :func:`find_sparse_features` finds it)
    is the one prefetched; a collection whose features it lacks is left out.
    """
    moved = apply_to_collection(
        batch, KeyedJaggedTensor, lambda kjt: kjt.to(device, non_blocking=True)
    )
    features = find_sparse_features(moved)
    if features is None:
        return moved
    keys = set(features.keys())
    for module in collections.values():
        if module.pipelined and set(module.feature_names) <= keys:
            module.prefetch(features)
    return moved
