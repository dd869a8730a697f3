"""Synthetic click data shaped by a model spec, with labels a DLRM can learn.

Every example is a pure function of ``(seed, global example index)``: its IDs, dense
features and label come from counter-based hashes, not from a sequential random
generator. So any rank can produce exactly its own rows of a global batch without
generating the others', a rank's stream never depends on the world size beyond
which rows it owns, and the sharding rule (concatenating the ranks' b-th batches
gives the single-rank b-th global batch) holds by construction.

Labels come from a hidden teacher: each (table, row) has a fixed pseudo-random
score, a sample's sparse signal is the sum of its IDs' scores, a fixed linear
function of the latent dense values is added, and the label is a Bernoulli draw of
the sigmoid. The teacher depends on the seed only, never on rank or batch size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from lightning_embark.data._columns import Columns, check_sharding, worker_share
from lightning_embark.data._hashing import hash_with, key, to_unit
from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec, TableSpec

HOTNESS = ("fixed", "poisson")
_LENGTHS, _IDS, _SCORES, _DENSE, _DENSE_PARAMS, _LABELS, _SCATTER = range(1, 8)
_SLOTS = 1 << 16  # IDs per sample are hashed as sample * _SLOTS + slot
_SPARSE_WEIGHT = 2.0
_DENSE_WEIGHT = 1.0
_BIAS = -1.0


def fixed_hotness(pooling_factor: float) -> int:
    """IDs per sample under ``hotness="fixed"``: the rounded pooling factor, at least 1."""
    return max(1, math.floor(pooling_factor + 0.5))


def _poisson_cdf(mean: float) -> np.ndarray:
    """CDF of Poisson(mean) on 0..k_max, closed at 1 so sampling never runs off the end."""
    k_max = min(_SLOTS - 1, math.ceil(mean + 12.0 * math.sqrt(mean) + 12.0))
    k = np.arange(k_max + 1, dtype=np.float64)
    log_pmf = k * math.log(mean) - mean - np.array([math.lgamma(x + 1.0) for x in k])
    cdf = np.cumsum(np.exp(log_pmf))
    cdf[-1] = 1.0
    return cdf


def zipf_ranks(u: np.ndarray, num_rows: int, alpha: float) -> np.ndarray:
    """Popularity ranks in ``[0, num_rows)`` from uniforms, P(rank k) ~ (k + 1)^-alpha.

    Inverts the CDF of the continuous power law on ``[1, num_rows + 1)`` in closed
    form, so it costs O(1) per ID whatever the table size (no per-row arrays).
    """
    log_n = math.log(num_rows + 1.0)
    s = 1.0 - alpha
    x = np.exp(u * log_n) if abs(s) < 1e-09 else np.exp(np.log1p(u * math.expm1(s * log_n)) / s)
    return np.minimum(np.floor(x).astype(np.int64) - 1, num_rows - 1).clip(min=0)


def _scatter_params(seed: int, table: int, num_rows: int) -> tuple[int, int]:
    """Multiplier coprime to ``num_rows`` (so ``k * m + c mod n`` is a bijection) and offset.

    The multiplier is near the golden ratio times n, which spreads consecutive
    ranks far apart, and small enough that ``k * m`` never overflows 63 bits.
    """
    if num_rows == 1:
        return 1, 0
    multiplier = max(1, min(int(num_rows * 0.6180339887), (1 << 63) // num_rows - 1))
    while math.gcd(multiplier, num_rows) != 1:
        multiplier -= 1
    return multiplier, key(seed, _SCATTER, table) % num_rows


class SyntheticDataset(IterableDataset[Batch]):
    """Endless or finite synthetic batches for a spec, sharded like the real datasets.

    Args:
        spec: Tables (rows, pooling factor), dense width and ID distribution.
        batch_size: Examples per batch on this rank.
        num_batches: Batches per rank per pass; None for an endless stream.
        seed: Selects the stream and the hidden teacher.
        rank: This rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the stream.
        hotness: ``"fixed"`` (``round(pooling_factor)`` IDs, at least 1) or
            ``"poisson"`` (Poisson(pooling_factor) IDs, possibly an empty bag).
        first_batch: Global batch the pass starts at; a held-out validation set is the
            same stream (same teacher) from past the training batches.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        batch_size: int,
        num_batches: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        hotness: str = "fixed",
        first_batch: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(spec, ModelSpec):
            raise ConfigError(
                f"spec must be a ModelSpec (see load_spec), got {type(spec).__name__}"
            )
        check_sharding(batch_size=batch_size, rank=rank, world_size=world_size)
        if num_batches is not None and (
            isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0
        ):
            raise ConfigError(
                "num_batches must be a non-negative integer or None (endless), got "
                f"{num_batches!r}"
            )
        if isinstance(first_batch, bool) or not isinstance(first_batch, int) or first_batch < 0:
            raise ConfigError(f"first_batch must be a non-negative integer, got {first_batch!r}")
        if hotness not in HOTNESS:
            raise ConfigError(f"hotness must be one of {HOTNESS}, got {hotness!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        too_hot = [t.name for t in spec.tables if fixed_hotness(t.pooling_factor) >= _SLOTS]
        if too_hot:
            raise ConfigError(
                f"tables {too_hot} have pooling factors of {_SLOTS} or more IDs per sample, "
                "beyond what the generator supports; lower their pooling_factor"
            )
        self.spec, self.batch_size, self.num_batches = spec, batch_size, num_batches
        self.seed, self.rank, self.world_size, self.hotness = seed, rank, world_size, hotness
        self.first_batch = first_batch
        self._poisson = {t.name: _poisson_cdf(t.pooling_factor) for t in spec.tables}
        self._scatter = [
            _scatter_params(seed, i, t.num_embeddings) for i, t in enumerate(spec.tables)
        ]
        self._dense_params = self._make_dense_params()

    @property
    def feature_names(self) -> list[str]:
        """KeyedJaggedTensor keys, in table order."""
        return self.spec.feature_names

    @property
    def global_batch_size(self) -> int:
        """Examples per global batch: ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per pass on this rank; TypeError for an endless stream, as Python expects."""
        if self.num_batches is None:
            raise TypeError("an endless SyntheticDataset (num_batches=None) has no length")
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        worker, num_workers = worker_share()
        indices = itertools.count() if self.num_batches is None else range(self.num_batches)
        for index in indices:
            if index % num_workers == worker:
                yield self.batch(self.first_batch + index)

    def batch(self, index: int) -> Batch:
        """This rank's ``index``-th batch: its rows of global batch ``index``."""
        start = index * self.global_batch_size + self.rank * self.batch_size
        return self.examples(start, start + self.batch_size)

    def global_batch(self, index: int) -> Batch:
        """The whole ``index``-th global batch, every rank's rows in rank order."""
        start = index * self.global_batch_size
        return self.examples(start, start + self.global_batch_size)

    def examples(self, start: int, stop: int) -> Batch:
        """Examples ``[start, stop)`` of the global stream as one batch."""
        columns, _ = self._generate(start, stop)
        return columns.to_batch(self.feature_names)

    def teacher_probabilities(self, start: int, stop: int) -> np.ndarray:
        """The teacher's click probability for examples ``[start, stop)`` (the best any
        model can predict; useful to bound a model's AUC)."""
        _, logits = self._generate(start, stop)
        return 1.0 / (1.0 + np.exp(-logits))

    def _make_dense_params(self) -> np.ndarray:
        """Per dense feature: log-scale mean, log-scale spread, teacher weight."""
        count = self.spec.num_dense_features
        u = to_unit(hash_with(key(self.seed, _DENSE_PARAMS), np.arange(3 * count))).reshape(3, -1)
        sign = np.where(u[2] < 0.5, -1.0, 1.0)
        return np.stack([0.5 + 3.5 * u[0], 0.5 + u[1], sign * (0.5 + 2.0 * np.abs(u[2] - 0.5))])

    def _dense(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Criteo-like counts, log1p-transformed, and their part of the teacher's logit."""
        count = self.spec.num_dense_features
        if count == 0:
            return np.zeros((samples.size, 0), np.float32), np.zeros(samples.size)
        counters = samples[:, None] * np.uint64(2 * count) + np.arange(2 * count, dtype=np.uint64)
        u = to_unit(hash_with(key(self.seed, _DENSE), counters))
        z = np.sqrt(-2.0 * np.log1p(-u[:, :count])) * np.cos(2.0 * np.pi * u[:, count:])
        mean, spread, weight = self._dense_params
        raw = np.maximum(np.floor(np.exp(mean + spread * z)) - 1.0, 0.0)
        return np.log1p(raw).astype(np.float32), z @ weight / math.sqrt(count)

    def _lengths(self, table: int, spec: TableSpec, samples: np.ndarray) -> np.ndarray:
        if self.hotness == "fixed":
            return np.full(samples.size, fixed_hotness(spec.pooling_factor), dtype=np.int64)
        u = to_unit(hash_with(key(self.seed, _LENGTHS, table), samples))
        return np.searchsorted(self._poisson[spec.name], u, side="right").astype(np.int64)

    def _ids(
        self, table: int, spec: TableSpec, owners: np.ndarray, slots: np.ndarray
    ) -> np.ndarray:
        counters = owners * np.uint64(_SLOTS) + slots.astype(np.uint64)
        u = to_unit(hash_with(key(self.seed, _IDS, table), counters))
        rows = spec.num_embeddings
        if self.spec.id_distribution.kind == "uniform":
            return np.minimum((u * rows).astype(np.int64), rows - 1)
        ranks = zipf_ranks(u, rows, self.spec.id_distribution.alpha).astype(np.uint64)
        multiplier, offset = self._scatter[table]
        scattered = (ranks * np.uint64(multiplier) + np.uint64(offset)) % np.uint64(rows)
        return scattered.astype(np.int64)

    def _row_scores(self, table: int, rows: np.ndarray) -> np.ndarray:
        """The teacher's fixed score of each (table, row): uniform with unit variance."""
        u = to_unit(hash_with(key(self.seed, _SCORES, table), rows.astype(np.uint64)))
        return math.sqrt(3.0) * (2.0 * u - 1.0)

    def _generate(self, start: int, stop: int) -> tuple[Columns, np.ndarray]:
        if not 0 <= start <= stop:
            raise ConfigError(
                f"example range must satisfy 0 <= start <= stop, got [{start}, {stop})"
            )
        samples = np.arange(start, stop, dtype=np.uint64)
        count = samples.size
        dense, dense_logit = self._dense(samples)
        lengths, values = [], []
        sparse_logit = np.zeros(count)
        for table, spec in enumerate(self.spec.tables):
            bag = self._lengths(table, spec, samples)
            local = np.repeat(np.arange(count), bag)
            firsts = np.concatenate(([0], np.cumsum(bag)[:-1])) if count else bag
            slots = np.arange(local.size) - np.repeat(firsts, bag)
            ids = self._ids(table, spec, samples[local], slots)
            scores = np.bincount(local, weights=self._row_scores(table, ids), minlength=count)
            sparse_logit += scores / math.sqrt(max(spec.pooling_factor, 1.0))
            lengths.append(bag)
            values.append(ids)
        logits = (
            _BIAS
            + _SPARSE_WEIGHT * sparse_logit / math.sqrt(len(self.spec.tables))
            + _DENSE_WEIGHT * dense_logit
        )
        draws = to_unit(hash_with(key(self.seed, _LABELS), samples))
        labels = (draws < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        columns = Columns(dense=dense, labels=labels, lengths=tuple(lengths), values=tuple(values))
        return columns, logits
