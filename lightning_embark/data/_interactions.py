"""Synthetic clicks whose label depends only on pairs of features inside known groups.

The ground truth a tower partitioner must recover: features ``F`` split into groups, and
a hidden teacher that gives every (table, row) a fixed vector ``u_t[row]`` of ``rank``
entries (uniform, unit variance) and scores a sample by the dot products of the pairs of
its features that share a group,

    logit = bias + scale * sum_g sum_{i < j in g} <u_i[x_i], u_j[x_j]> / sqrt(P rank),

``P`` the number of such pairs, so the logit's interaction part has unit variance times
``scale``. No feature has a main effect and no pair across groups matters, so a model
can do better than chance only through the planted pairs: a flat DLRM that learns them
relies on exactly those, which the affinity of :mod:`lightning_embark.planner` then
shows. Every table is one-hot with IDs uniform over its rows; features in no group are
noise.

Like :class:`~lightning_embark.data.SyntheticDataset`, every example is a pure function
of ``(seed, global example index)``, so ranks produce their own rows of a global batch
and a held-out set is the same stream past the training examples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from lightning_embark.data._columns import Columns, check_sharding
from lightning_embark.data._hashing import hash_with, key, to_unit
from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec

_IDS, _VECTORS, _LABELS = 11, 12, 13


class InteractionDataset(IterableDataset[Batch]):
    """Batches of a one-hot spec whose clicks follow the planted group pairs (see the
    module docstring).

    Args:
        spec: One-hot tables (one feature each); no dense features are generated.
        groups: Feature names per group; every pair inside a group interacts.
        batch_size: Examples per batch on this rank.
        num_batches: Batches per rank per pass.
        seed: Selects the stream and the teacher.
        rank: This rank, in ``[0, world_size)``.
        world_size: Ranks sharing the stream.
        first_batch: Global batch the pass starts at (a held-out set: past the training).
        teacher_rank: Entries of each row's hidden vector.
        scale: Standard deviation of the logit's interaction part.
        bias: The logit's constant.

    Raises:
        ConfigError: a group with fewer than two features, a feature in two groups or
            not in the spec, or a bad count.
    """

    def __init__(
        self,
        spec: ModelSpec,
        groups: Sequence[Sequence[str]],
        *,
        batch_size: int,
        num_batches: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        first_batch: int = 0,
        teacher_rank: int = 4,
        scale: float = 3.0,
        bias: float = 0.0,
    ) -> None:
        super().__init__()
        check_sharding(batch_size=batch_size, rank=rank, world_size=world_size)
        names = spec.feature_names
        flat = [f for g in groups for f in g]
        unknown = sorted(set(flat) - set(names))
        if unknown or len(set(flat)) != len(flat) or any(len(g) < 2 for g in groups):
            raise ConfigError(
                f"interaction groups {[list(g) for g in groups]}: each needs two or more of the "
                f"spec's features {names}, none twice (unknown: {unknown})"
            )
        for count, what in ((num_batches, "num_batches"), (first_batch, "first_batch")):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ConfigError(f"{what} must be a non-negative integer, got {count!r}")
        if teacher_rank < 1 or not scale > 0:
            raise ConfigError(
                f"teacher_rank must be >= 1 and scale > 0, got {teacher_rank}, {scale}"
            )
        self.spec, self.batch_size, self.num_batches = spec, batch_size, num_batches
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.first_batch, self.teacher_rank = first_batch, teacher_rank
        self.scale, self.bias = float(scale), float(bias)
        self.groups = tuple(tuple(g) for g in groups)
        index = {n: i for i, n in enumerate(names)}
        self.pairs = [
            (index[a], index[b]) for g in self.groups for a, b in itertools.combinations(g, 2)
        ]

    @property
    def feature_names(self) -> list[str]:
        """KeyedJaggedTensor keys, in table order."""
        return self.spec.feature_names

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        for index in range(self.num_batches):
            start = (self.first_batch + index) * self.batch_size * self.world_size
            start += self.rank * self.batch_size
            yield self.examples(start, start + self.batch_size)

    def examples(self, start: int, stop: int) -> Batch:
        """Examples ``[start, stop)`` of the global stream as one batch."""
        return self._generate(start, stop)[0].to_batch(self.feature_names)

    def teacher_probabilities(self, start: int, stop: int) -> np.ndarray:
        """The teacher's click probability of examples ``[start, stop)`` (what bounds a
        model's AUC)."""
        return 1.0 / (1.0 + np.exp(-self._generate(start, stop)[1]))

    def _vectors(self, table: int, rows: np.ndarray) -> np.ndarray:
        """``u_t[row]`` ``[len(rows), rank]``: uniform entries of unit variance."""
        r = self.teacher_rank
        counters = rows.astype(np.uint64)[:, None] * np.uint64(r) + np.arange(r, dtype=np.uint64)
        u = to_unit(hash_with(key(self.seed, _VECTORS, table), counters))
        return math.sqrt(3.0) * (2.0 * u - 1.0)

    def _generate(self, start: int, stop: int) -> tuple[Columns, np.ndarray]:
        samples = np.arange(start, stop, dtype=np.uint64)
        ids = []
        for table, spec in enumerate(self.spec.tables):
            u = to_unit(hash_with(key(self.seed, _IDS, table), samples))
            ids.append(
                np.minimum((u * spec.num_embeddings).astype(np.int64), spec.num_embeddings - 1)
            )
        vectors = {t: self._vectors(t, ids[t]) for t in {t for p in self.pairs for t in p}}
        score = sum(
            ((vectors[i] * vectors[j]).sum(axis=1) for i, j in self.pairs), np.zeros(len(samples))
        )
        logits = self.bias + self.scale * score / math.sqrt(len(self.pairs) * self.teacher_rank)
        draws = to_unit(hash_with(key(self.seed, _LABELS), samples))
        labels = (draws < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        ones = np.ones(len(samples), dtype=np.int64)
        columns = Columns(
            dense=np.zeros((len(samples), self.spec.num_dense_features), dtype=np.float32),
            labels=labels,
            lengths=tuple(ones for _ in ids),
            values=tuple(ids),
        )
        return columns, logits
