"""One rank's local batch as the engine sees it: per feature, IDs and bag lengths.

The engine's boundary is a mapping from feature name to :class:`FeatureBatch`; a
``KeyedJaggedTensor`` (torchrec's) is cut once per step into the same
(:func:`jagged_by_key`); every cluster works on these. A batch lives on the engine's
device, and everything derived from it here is created next to its tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, kw_only=True)
class FeatureBatch:
    """One feature of the local batch: IDs, bag lengths (one per sample), optional weights.

    All three live on one device (the engine's, see
    :class:`~lightning_embark.engine.EmbeddingEngine`).
    """

    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.lengths.numel()

    def offsets(self) -> torch.Tensor:
        lengths = self.lengths.to(torch.int64)
        return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])

    def bag_of(self) -> torch.Tensor:
        """The sample index of every ID."""
        lengths = self.lengths.to(torch.int64)
        return torch.repeat_interleave(
            torch.arange(self.batch_size, device=lengths.device),
            lengths,
            output_size=self.values.numel(),
        )


def jagged_by_key(
    features: Any,
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """``(values, lengths, weights)`` per key of a KJT; unlike ``KJT.to_dict`` it accepts 0
    samples."""
    keys = features.keys()
    lengths = features.lengths().reshape(len(keys), features.stride())
    per_key = lengths.sum(1).tolist()
    values = torch.split(features.values(), per_key)
    weights = features.weights_or_none()
    split_weights = torch.split(weights, per_key) if weights is not None else [None] * len(keys)
    return {k: (v, n, w) for k, v, n, w in zip(keys, values, lengths, split_weights, strict=True)}


def jagged_of(batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """``(values, lengths, weights)`` per feature of a batch given either way: a mapping of
    feature name to :class:`FeatureBatch`, or anything with a ``KeyedJaggedTensor``'s
    ``keys`` / ``lengths`` / ``values`` / ``weights_or_none`` / ``stride``."""
    if isinstance(batch, Mapping):
        return {k: (b.values, b.lengths, b.weights) for k, b in batch.items()}
    return jagged_by_key(batch)


def mean_scale(batch: FeatureBatch) -> torch.Tensor:
    """``1 / max(length, 1)`` per sample, as a column: mean pooling of empty bags gives 0."""
    return 1.0 / batch.lengths.clamp_min(1).to(torch.float32).unsqueeze(1)
