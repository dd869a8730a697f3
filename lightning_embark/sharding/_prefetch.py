"""The strategy's side of the input pipeline: each training batch prefetched as it is fetched.

Lightning's data fetcher takes batch ``i + 1`` from the dataloader before step ``i`` runs
(to know whether ``i`` is the last). :class:`PrefetchingLoader` wraps the training
dataloader so that taking a batch also starts its input distribution in every sharded
collection (:meth:`~lightning_embark.engine.EmbeddingEngine.prefetch`): the IDs of batch
``i + 1`` travel while step ``i`` computes, and step ``i + 1``'s lookup finds them there.

A collection matches its prefetch by the batch's ``KeyedJaggedTensor`` (its ``values()``
tensor), so the batch's features are moved to the engine's device here, before Lightning's
own transfer, which then has nothing left to move for them. A batch whose dense features
(or labels) hold NaN or inf is rejected there, on every rank (:func:`nonfinite_error`). A
model that rebuilds the
``KeyedJaggedTensor`` before the lookup gains nothing (its lookups distribute their input
themselves, as without a pipeline; the engine warns once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark._host_work import host_work
from lightning_embark.errors import ConfigError
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
    rejected = nonfinite_error(batch)
    for module in collections.values():
        if module.pipelined and set(module.feature_names) <= keys:
            module.prefetch(features, rejected=rejected)
    return moved


def nonfinite_error(batch: Any) -> ConfigError | None:
    """A :class:`ConfigError` naming the floating-point tensors of ``batch`` (outside its
    ``KeyedJaggedTensor`` s: the dense features, the labels) that hold NaN or inf, or None.

    Such a batch is rejected like one with an out-of-range ID, on every rank (the input
    distribution carries the status): trained on, one NaN reaches every rank's dense
    weights through the all-reduce of their gradients. The tensors are checked where the
    dataloader made them (the CPU, before Lightning's transfer), so the check waits for no
    device.
    """
    bad = [(name, count) for name, count in _nonfinite(batch, "batch") if count]
    if not bad:
        return None
    rank = dist.get_rank() if dist.is_initialized() else 0
    where = ", ".join(f"{count} in {name}" for name, count in bad)
    return ConfigError(
        f"rank {rank}: the batch holds non-finite values (NaN or inf): {where}; clean or impute "
        "them in the dataset (e.g. torch.nan_to_num) before training"
    )


def _nonfinite(value: Any, name: str) -> list[tuple[str, int]]:
    """(name, count of non-finite values) of every floating-point tensor in ``value``."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return []
        if value.device.type == "cpu":  # the dataloader's tensor: nothing to wait for
            with host_work():
                return [(name, int((~torch.isfinite(value)).sum()))]
        return [(name, int((~torch.isfinite(value)).sum()))]
    if isinstance(value, KeyedJaggedTensor):
        return []
    if isinstance(value, Mapping):
        return [x for k, v in value.items() for x in _nonfinite(v, f"{name}[{k!r}]")]
    if isinstance(value, list | tuple):
        return [x for i, v in enumerate(value) for x in _nonfinite(v, f"{name}[{i}]")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            x
            for f in dataclasses.fields(value)
            for x in _nonfinite(getattr(value, f.name), f"{name}.{f.name}")
        ]
    return []
