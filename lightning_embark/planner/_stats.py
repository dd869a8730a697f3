"""Per-feature access statistics at a target per-rank batch size.

The planner picks a cluster type per table from two numbers per feature
(docs/architecture.md#embedding-clusters): the mean hotness ``h_f`` (IDs per sample) and the
unique ratio
``U_f / (B * h_f)``, the share of a rank's ``B * h_f`` IDs that survive
de-duplication. RB moves ``B`` pooled rows per feature whatever the hotness; UB moves
``U_f`` unique rows, so UB wins where ``U_f < B``. Both numbers depend on the batch
size (more samples, more repeats), so they are measured at the batch the job runs.

Sources, best first: a real data file, the synthetic generator for a spec, and an
analytic estimate from the spec's pooling factors and ID distribution (uniform or
Zipf), which :attr:`DataStats.measured` marks as not measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torchrec.datasets.utils import Batch

from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec, TableSpec

STATS_VERSION = 1
#: Popularity ranks summed exactly by the Zipf estimate; the tail is integrated in bins.
_EXACT_RANKS = 65_536
_TAIL_BINS = 4_096


@dataclass(frozen=True, kw_only=True)
class FeatureStats:
    """One feature's statistics at the batch size of its :class:`DataStats`.

    Attributes:
        hotness: Mean IDs per sample ``h_f``.
        unique_ratio: Mean over batches of ``U_f / (B * h_f)`` in ``(0, 1]``.
        unique_ratio_std: Standard deviation of that ratio over batches.
    """

    hotness: float
    unique_ratio: float
    unique_ratio_std: float = 0.0

    def __post_init__(self) -> None:
        if not (self.hotness >= 0 and math.isfinite(self.hotness)):
            raise ConfigError(
                f"FeatureStats.hotness must be a finite number >= 0, got {self.hotness!r}"
            )
        if not 0.0 <= self.unique_ratio <= 1.0:
            raise ConfigError(
                f"FeatureStats.unique_ratio must be in [0, 1], got {self.unique_ratio!r}"
            )
        if not self.unique_ratio_std >= 0.0:
            raise ConfigError(
                f"FeatureStats.unique_ratio_std must be >= 0, got {self.unique_ratio_std!r}"
            )

    def unique_ids(self, batch_size: int) -> float:
        """Expected unique IDs ``U_f`` in one rank's batch of ``batch_size`` samples."""
        return self.unique_ratio * batch_size * self.hotness


@dataclass(frozen=True, kw_only=True)
class DataStats:
    """Statistics of every feature at one per-rank batch size.

    Attributes:
        batch_size: Per-rank batch the numbers hold for.
        features: Feature name -> :class:`FeatureStats`.
        source: What they were computed from (file, generator, analytic estimate).
        measured: False for the analytic fallback, so reports can say so.
        num_batches: Batches measured (0 for the analytic estimate).
    """

    batch_size: int
    features: dict[str, FeatureStats] = field(default_factory=dict)
    source: str = ""
    measured: bool = True
    num_batches: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(
                f"DataStats.batch_size must be a positive integer, got {self.batch_size!r}"
            )

    def for_spec(self, spec: ModelSpec, batch_size: int | None = None) -> list[FeatureStats]:
        """Stats in the spec's table order; features the data lacks fall back to the spec.

        A batch size other than the measured one is a warning sign, not an error: the
        unique ratio is then scaled by the analytic model's ratio between the two sizes.
        """
        out = []
        for table in spec.tables:
            stats = self.features.get(table.feature_name)
            if stats is None:
                stats = analytic_feature(table, spec, batch_size or self.batch_size)
            elif batch_size is not None and batch_size != self.batch_size:
                here = analytic_feature(table, spec, self.batch_size).unique_ratio
                there = analytic_feature(table, spec, batch_size).unique_ratio
                scaled = (
                    min(1.0, stats.unique_ratio * there / here) if here > 0 else stats.unique_ratio
                )
                stats = FeatureStats(
                    hotness=stats.hotness,
                    unique_ratio=scaled,
                    unique_ratio_std=stats.unique_ratio_std,
                )
            out.append(stats)
        return out

    def to_dict(self) -> dict:
        return {
            "version": STATS_VERSION,
            "batch_size": self.batch_size,
            "source": self.source,
            "measured": self.measured,
            "num_batches": self.num_batches,
            "features": {
                name: {
                    "hotness": s.hotness,
                    "unique_ratio": s.unique_ratio,
                    "unique_ratio_std": s.unique_ratio_std,
                }
                for name, s in self.features.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict) -> DataStats:
        if data.get("version", STATS_VERSION) != STATS_VERSION:
            raise ConfigError(
                f"stats version {data.get('version')!r} is not supported; re-run embark-stats"
            )
        try:
            return cls(
                batch_size=int(data["batch_size"]),
                source=str(data.get("source", "")),
                measured=bool(data.get("measured", True)),
                num_batches=int(data.get("num_batches", 0)),
                features={name: FeatureStats(**f) for name, f in data["features"].items()},
            )
        except (KeyError, TypeError) as error:
            raise ConfigError(
                f"malformed statistics JSON: {error}; re-run embark-stats"
            ) from error

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> DataStats:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read statistics {str(path)!r}: {error}") from error


def measure(
    batches: Iterable[Batch], *, batch_size: int, num_batches: int | None = None, source: str = ""
) -> DataStats:
    """Measure hotness and unique ratio per feature over torchrec batches.

    Args:
        batches: Per-rank batches (any of the project's datasets yields them).
        batch_size: Their size; a shorter final batch is skipped, since the unique
            ratio depends on the batch size.
        num_batches: Stop after this many batches (None: all).
        source: Label for reports.

    Raises:
        ConfigError: no full batch was seen.
    """
    hot: dict[str, list[float]] = {}
    ratio: dict[str, list[float]] = {}
    seen = 0
    for batch in batches:
        if num_batches is not None and seen >= num_batches:
            break
        kjt = batch.sparse_features
        if kjt.stride() != batch_size:
            continue
        for name, jagged in kjt.to_dict().items():
            values = jagged.values().numpy()
            hot.setdefault(name, []).append(values.size / batch_size)
            ratio.setdefault(name, []).append(
                np.unique(values).size / values.size if values.size else 1.0
            )
        seen += 1
    if not seen:
        raise ConfigError(
            f"no full batch of {batch_size} samples in {source or 'the data'}; lower --batch-size "
            "or give more data"
        )
    features = {
        name: FeatureStats(
            hotness=float(np.mean(hot[name])),
            unique_ratio=float(np.mean(ratio[name])),
            unique_ratio_std=float(np.std(ratio[name])),
        )
        for name in hot
    }
    return DataStats(
        batch_size=batch_size, features=features, source=source, measured=True, num_batches=seen
    )


def from_synthetic(
    spec: ModelSpec, *, batch_size: int, num_batches: int = 4, seed: int = 0
) -> DataStats:
    """Measure the synthetic generator's batches for ``spec`` (fixed hotness)."""
    from lightning_embark.data import SyntheticDataset

    data = SyntheticDataset(spec, batch_size=batch_size, num_batches=num_batches, seed=seed)
    return measure(
        data, batch_size=batch_size, source=f"synthetic generator for {spec.name} (seed {seed})"
    )


def from_spec(spec: ModelSpec, *, batch_size: int) -> DataStats:
    """Analytic estimate from pooling factors and the spec's ID distribution (not measured)."""
    dist = spec.id_distribution
    label = "uniform" if dist.kind == "uniform" else f"zipf(alpha={dist.alpha})"
    return DataStats(
        batch_size=batch_size,
        features={t.feature_name: analytic_feature(t, spec, batch_size) for t in spec.tables},
        source=f"analytic estimate from {spec.name} pooling factors and {label} IDs (not "
        "measured)",
        measured=False,
    )


def analytic_feature(table: TableSpec, spec: ModelSpec, batch_size: int) -> FeatureStats:
    """Expected unique ratio of ``batch_size * h`` independent draws from the table."""
    draws = batch_size * table.pooling_factor
    rows = table.num_embeddings
    if spec.id_distribution.kind == "uniform":
        unique = rows * -math.expm1(draws * math.log1p(-1.0 / rows)) if rows > 1 else 1.0
    else:
        unique = _zipf_unique(rows, spec.id_distribution.alpha, draws)
    return FeatureStats(
        hotness=table.pooling_factor, unique_ratio=min(1.0, max(unique, 1.0) / draws)
    )


def _zipf_unique(rows: int, alpha: float, draws: float) -> float:
    """Expected distinct ranks under the generator's power law ``floor(x) - 1`` (see
    :func:`lightning_embark.data._synthetic.zipf_ranks`): head exactly, tail in log bins."""
    s = 1.0 - alpha
    log_total = math.log(rows + 1.0)

    def cdf(x: np.ndarray) -> np.ndarray:  # P(X < x) for the continuous law on [1, rows + 1)
        if abs(s) < 1e-9:
            return np.log(x) / log_total
        return np.expm1(s * np.log(x)) / math.expm1(s * log_total)

    head = min(rows, _EXACT_RANKS)
    k = np.arange(1, head + 1, dtype=np.float64)
    p = cdf(k + 1.0) - cdf(k)
    unique = float(np.sum(-np.expm1(draws * np.log1p(-np.clip(p, 0.0, 1.0 - 1e-15)))))
    if rows > head:
        edges = np.unique(np.geomspace(head + 1.0, rows + 1.0, _TAIL_BINS + 1).round())
        width = np.diff(edges)
        p_each = (cdf(edges[1:]) - cdf(edges[:-1])) / width
        unique += float(np.sum(width * -np.expm1(draws * np.log1p(-p_each))))
    return unique
