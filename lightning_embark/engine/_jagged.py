"""A local batch as one jagged tensor: every feature's IDs one after another.

The engine's per-step work must not grow with the number of tables: a step with 510
tables that cuts its batch into 510 :class:`~lightning_embark.engine.FeatureBatch`es
and loops over them spends more on dispatching small ops than on lookups. A
:class:`JaggedBatch` keeps a ``KeyedJaggedTensor``'s layout instead (IDs feature after
feature, bag lengths ``[features, batch]``, the IDs per feature on the host), and the
clusters cut it with whole-batch gathers (:func:`segment_index`).

The IDs per feature are host integers: a KJT knows them (``length_per_key``: one host
copy per batch, which every consumer of the batch shares), and they size everything the
exchanges send.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from lightning_embark._host_work import to_device
from lightning_embark.engine._batch import FeatureBatch


def segment_index(starts: Sequence[int], lengths: Sequence[int], device: torch.device) -> Tensor:
    """The positions of segments ``[starts[j], starts[j] + lengths[j])`` one after another
    (int64, on ``device``): gathering with it concatenates the segments.

    ``index[k] = starts[j] + (k - out_j)`` for the ``k`` of segment ``j``, whose output
    starts at ``out_j = sum(lengths[:j])``: one ``repeat_interleave`` whatever the number of
    segments (the sizes are host integers, so nothing syncs).
    """
    total = sum(lengths)
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    if len(starts) == 1:
        return torch.arange(starts[0], starts[0] + total, device=device)
    out = list(itertools.accumulate(lengths, initial=0))[:-1]
    shift = to_device(
        [s - o for s, o in zip(starts, out, strict=True)], dtype=torch.int64, device=device
    )
    counts = to_device(list(lengths), dtype=torch.int64, device=device)
    return torch.repeat_interleave(shift, counts, output_size=total) + torch.arange(
        total, device=device
    )


def bin_counts(keys: Tensor, size: int) -> Tensor:
    """``torch.bincount(keys, minlength=size)`` for int64 ``keys`` in ``[0, size)``, without
    the host: CUDA's ``bincount`` reads the keys' minimum and maximum on the host to size
    its output; a scatter-add of ones into ``size`` zeros does not."""
    counts = torch.zeros(size, dtype=torch.int64, device=keys.device)
    return counts.index_add_(0, keys, torch.ones_like(keys))


def device_segment_index(starts: Tensor, lengths: Tensor, total: int) -> Tensor:
    """:func:`segment_index` of segments given as device tensors (int64), ``total`` their
    summed length (known on the host, so nothing syncs)."""
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=starts.device)
    out = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - out, lengths, output_size=total) + torch.arange(
        total, device=starts.device
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class JaggedBatch:
    """Several features of one rank's local batch, feature after feature.

    Attributes:
        values: ``[N]`` IDs, feature after feature, each feature's in sample order.
        lengths: ``[F, B]`` int64 bag lengths.
        counts: IDs per feature, on the host (they sum to ``N``).
        weights: ``[N]`` per-ID weights, or None.
    """

    values: Tensor
    lengths: Tensor
    counts: tuple[int, ...]
    weights: Tensor | None = None

    def __post_init__(self) -> None:
        assert self.lengths.dim() == 2 and self.lengths.shape[0] == len(self.counts)
        assert self.values.numel() == sum(self.counts), (self.values.numel(), self.counts)

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[1]

    @property
    def num_features(self) -> int:
        return len(self.counts)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """Each feature's first position in :attr:`values`."""
        return tuple(itertools.accumulate(self.counts, initial=0))[:-1]

    @classmethod
    def from_features(
        cls, features: Sequence[FeatureBatch], batch_size: int, device: torch.device
    ) -> JaggedBatch:
        """The features concatenated (their weights only when every one has them)."""
        if not features:
            return cls.empty(0, batch_size, device)
        weighted = all(f.weights is not None for f in features)
        return cls(
            values=torch.cat([f.values for f in features]),
            lengths=torch.stack([f.lengths.to(torch.int64) for f in features]),
            counts=tuple(f.values.numel() for f in features),
            weights=torch.cat([f.weights for f in features]) if weighted else None,  # type: ignore[misc]
        )

    @classmethod
    def empty(cls, num_features: int, batch_size: int, device: torch.device) -> JaggedBatch:
        """``num_features`` features of ``batch_size`` empty bags."""
        return cls(
            values=torch.zeros(0, dtype=torch.int64, device=device),
            lengths=torch.zeros(num_features, batch_size, dtype=torch.int64, device=device),
            counts=(0,) * num_features,
        )

    def select(self, positions: Sequence[int]) -> JaggedBatch:
        """The features at ``positions``, in that order (views for a contiguous run)."""
        positions = list(positions)
        if positions == list(range(self.num_features)):
            return self
        counts = tuple(self.counts[p] for p in positions)
        if positions and positions == list(range(positions[0], positions[-1] + 1)):
            start = self.starts[positions[0]]
            cut = slice(start, start + sum(counts))
            return JaggedBatch(
                values=self.values[cut],
                lengths=self.lengths[positions[0] : positions[-1] + 1],
                counts=counts,
                weights=self.weights[cut] if self.weights is not None else None,
            )
        index = segment_index([self.starts[p] for p in positions], counts, self.device)
        rows = to_device(positions, dtype=torch.int64, device=self.device)
        return JaggedBatch(
            values=self.values[index],
            lengths=self.lengths.index_select(0, rows),
            counts=counts,
            weights=self.weights[index] if self.weights is not None else None,
        )

    def without_weights(self) -> JaggedBatch:
        if self.weights is None:
            return self
        return JaggedBatch(values=self.values, lengths=self.lengths, counts=self.counts)

    def feature(self, i: int) -> FeatureBatch:
        """Feature ``i`` as a :class:`FeatureBatch` (views)."""
        cut = slice(self.starts[i], self.starts[i] + self.counts[i])
        return FeatureBatch(
            values=self.values[cut],
            lengths=self.lengths[i],
            weights=self.weights[cut] if self.weights is not None else None,
        )

    def features(self) -> list[FeatureBatch]:
        """Every feature as a :class:`FeatureBatch` (views)."""
        return [self.feature(i) for i in range(self.num_features)]

    @cached_property
    def bag_offsets(self) -> Tensor:
        """``[F * B + 1]`` int64: where each bag (feature-major) starts in :attr:`values`."""
        flat = self.lengths.reshape(-1)
        return torch.cat([flat.new_zeros(1), torch.cumsum(flat, 0)])

    @cached_property
    def bag_of(self) -> Tensor:
        """``[N]`` int64: each ID's bag, ``feature * B + sample``."""
        flat = self.lengths.reshape(-1)
        bags = torch.arange(flat.numel(), device=flat.device)
        return torch.repeat_interleave(bags, flat, output_size=self.values.numel())

    @cached_property
    def feature_of(self) -> Tensor:
        """``[N]`` int64: each ID's feature."""
        features = torch.arange(self.num_features, device=self.device)
        counts = to_device(self.counts, dtype=torch.int64, device=self.device)
        return torch.repeat_interleave(features, counts, output_size=self.values.numel())
