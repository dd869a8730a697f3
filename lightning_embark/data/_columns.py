"""Columnar example blocks, re-batching into global batches, and per-rank slicing.

Datasets parse or generate examples in blocks of any size; this module cuts the
stream into *global* batches of ``batch_size * world_size`` consecutive examples
and gives each rank its contiguous slice. Keeping that rule in one place is what
guarantees that the ranks' b-th batches, concatenated in rank order, equal the
b-th batch of a single-rank run with the global batch size.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Columns:
    """A block of examples in columnar form (numpy, so that parsing stays cheap).

    Attributes:
        dense: float32 ``[n, num_dense]``.
        labels: float32 ``[n]``.
        lengths: One int64 ``[n]`` array per feature: IDs per example (bag size).
        values: One int64 array per feature: the IDs, example after example.
    """

    dense: np.ndarray
    labels: np.ndarray
    lengths: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]

    @property
    def num_rows(self) -> int:
        """Number of examples in the block."""
        return int(self.labels.shape[0])

    @functools.cached_property
    def _offsets(self) -> tuple[np.ndarray, ...]:
        return tuple(
            np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))) for lengths in self.lengths
        )

    def slice(self, start: int, stop: int) -> Columns:
        """Examples ``[start, stop)`` as a new block (views where possible)."""
        return Columns(
            dense=self.dense[start:stop],
            labels=self.labels[start:stop],
            lengths=tuple(lengths[start:stop] for lengths in self.lengths),
            values=tuple(
                values[offsets[start] : offsets[stop]]
                for values, offsets in zip(self.values, self._offsets, strict=False)
            ),
        )

    def take(self, mask: np.ndarray) -> Columns:
        """The examples where the boolean ``mask`` is true, in order."""
        if mask.all():
            return self
        values = []
        for vals, lengths in zip(self.values, self.lengths, strict=False):
            values.append(vals[np.repeat(mask, lengths)])
        return Columns(
            dense=self.dense[mask],
            labels=self.labels[mask],
            lengths=tuple(lengths[mask] for lengths in self.lengths),
            values=tuple(values),
        )

    @staticmethod
    def concat(blocks: Sequence[Columns]) -> Columns:
        """One block holding ``blocks`` one after the other."""
        if len(blocks) == 1:
            return blocks[0]
        num_features = len(blocks[0].lengths)
        return Columns(
            dense=np.concatenate([b.dense for b in blocks]),
            labels=np.concatenate([b.labels for b in blocks]),
            lengths=tuple(
                np.concatenate([b.lengths[f] for b in blocks]) for f in range(num_features)
            ),
            values=tuple(
                np.concatenate([b.values[f] for b in blocks]) for f in range(num_features)
            ),
        )

    def to_batch(self, keys: Sequence[str]) -> Batch:
        """torchrec's ``Batch``: KJT values key-major, int64 IDs, int32 lengths."""
        values = np.concatenate(self.values) if self.values else np.zeros(0, np.int64)
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=list(keys),
            values=torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)),
            lengths=torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int32)),
        )
        return Batch(
            dense_features=torch.from_numpy(np.ascontiguousarray(self.dense, dtype=np.float32)),
            sparse_features=sparse,
            labels=torch.from_numpy(np.ascontiguousarray(self.labels, dtype=np.float32)),
        )


def check_sharding(*, batch_size: int, rank: int, world_size: int) -> None:
    """Validate the per-rank batch size and the rank within the world.

    Raises:
        ConfigError: naming the bad value and the valid range.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer (per rank), got {batch_size!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")


def rank_bounds(num_rows: int, *, rank: int, world_size: int) -> tuple[int, int]:
    """Rows of a global batch that belong to ``rank``.

    A full global batch splits into equal parts; a short final one splits as evenly
    as possible (the first ``num_rows % world_size`` ranks get one row more), so a
    rank may get zero rows but every rank still yields the same number of batches,
    which keeps collectives in step.
    """
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def global_batches(
    blocks: Iterable[Columns], *, global_size: int, drop_last: bool
) -> Iterator[Columns]:
    """Re-cut a stream of blocks of any size into blocks of ``global_size`` rows."""
    pending: list[Columns] = []
    pending_rows = 0
    for block in blocks:
        if block.num_rows == 0:
            continue
        pending.append(block)
        pending_rows += block.num_rows
        if pending_rows < global_size:
            continue
        buffer = Columns.concat(pending)
        full = buffer.num_rows // global_size
        for index in range(full):
            yield buffer.slice(index * global_size, (index + 1) * global_size)
        rest = buffer.slice(full * global_size, buffer.num_rows)
        pending = [rest] if rest.num_rows else []
        pending_rows = rest.num_rows
    if pending_rows and not drop_last:
        yield Columns.concat(pending)


def worker_share() -> tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker, or (0, 1).

    With ``num_workers > 1`` each worker keeps every ``num_workers``-th batch;
    DataLoader takes batches from workers round-robin, so the order is preserved.
    """
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def rank_batches(
    blocks: Iterable[Columns],
    *,
    keys: Sequence[str],
    batch_size: int,
    rank: int,
    world_size: int,
    drop_last: bool,
) -> Iterator[Batch]:
    """This rank's batches from a stream of example blocks (the sharding rule)."""
    worker, num_workers = worker_share()
    stream = global_batches(blocks, global_size=batch_size * world_size, drop_last=drop_last)
    for index, block in enumerate(stream):
        if index % num_workers != worker:
            continue
        start, stop = rank_bounds(block.num_rows, rank=rank, world_size=world_size)
        yield block.slice(start, stop).to_batch(keys)
