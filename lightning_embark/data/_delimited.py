"""A generic reader for delimited CTR data (CSV, TSV, ``::``), streamed as torchrec batches.

One :class:`DelimitedFormat` describes where the label, the dense and the categorical
columns are and how to turn their text into numbers; :class:`DelimitedDataset` streams
a file in chunks, splits it into train/val by a stable hash of the example index (no
need to know the file length), and cuts it into per-rank batches following the
sharding rule of :mod:`lightning_embark.data._columns`.
"""

from __future__ import annotations

import codecs
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from lightning_embark.data._columns import Columns, check_sharding, rank_batches
from lightning_embark.data._hashing import hash_with, key, to_unit
from lightning_embark.data._parsing import ColumnPlan, ParsedChunk, parse_stream, read_records
from lightning_embark.data._sizes import NumEmbeddings, resolve_num_embeddings
from lightning_embark.errors import ConfigError, DataFormatError

logger = logging.getLogger(__name__)

ColumnRef = str | int

CATEGORICAL_ENCODINGS = ("hex32", "string", "int")
DENSE_TRANSFORMS = ("log1p", "none")
SPLITS = ("train", "val", "all")
_SPLIT_TAG = 0x5B117
_MAX_REPORTED = 20


def _check_column(ref: object, role: str, has_header: bool) -> None:
    if isinstance(ref, bool) or not isinstance(ref, (str, int)):
        raise ConfigError(f"{role} must be a column name or a 0-based index, got {ref!r}")
    if isinstance(ref, int) and ref < 0:
        raise ConfigError(f"{role} index must be >= 0 (0-based), got {ref}")
    if isinstance(ref, str):
        if not ref:
            raise ConfigError(f"{role} name must be non-empty")
        if not has_header:
            raise ConfigError(
                f"{role} {ref!r} is a column name but has_header=False; "
                "set has_header=True or give 0-based column indices"
            )


@dataclass(frozen=True, kw_only=True)
class DelimitedFormat:
    """Where a delimited file keeps its label, dense and categorical columns.

    Attributes:
        delimiter: Field separator: one character (parsed with :mod:`csv`, quotes
            honoured) or a longer string such as MovieLens' ``"::"`` (plain split).
        has_header: Whether the first line names the columns.
        label_column: Name or 0-based index of the label.
        dense_columns: Names or indices of the dense (numeric) features.
        categorical_columns: Names or indices of the categorical features.
        feature_names: KeyedJaggedTensor keys, one per categorical column; default
            the column names when given by name, else ``C1, C2, ...``.
        categorical_encoding: ``"hex32"`` (Criteo's 8-hex-digit hashes), ``"string"``
            (any text, CRC-32 hashed: stable across processes, unlike ``hash()``) or
            ``"int"`` (decimal integers such as user IDs, used as they are).
        dense_transform: ``"log1p"`` (DLRM's ``log(1 + max(x, 0))``) or ``"none"``.
        label_threshold: If set, label = value >= threshold (e.g. ratings >= 4);
            otherwise the value itself, which must lie in [0, 1].
        multi_value_separator: If set, a categorical field holds several values
            (e.g. ``"|"`` for MovieLens genres), all put in one bag.
        encoding: Text encoding (``latin-1`` for some MovieLens files).
        quoting: Whether ``"`` quotes fields (one-character delimiters only).
        num_columns: Expected fields per line; default the header's count, or the
            first line's when there is no header.
    """

    delimiter: str = ","
    has_header: bool = False
    label_column: ColumnRef = 0
    dense_columns: tuple[ColumnRef, ...] = ()
    categorical_columns: tuple[ColumnRef, ...] = ()
    feature_names: tuple[str, ...] | None = None
    categorical_encoding: str = "string"
    dense_transform: str = "log1p"
    label_threshold: float | None = None
    multi_value_separator: str | None = None
    encoding: str = "utf-8"
    quoting: bool = True
    num_columns: int | None = None

    def __post_init__(self) -> None:
        for name in ("dense_columns", "categorical_columns", "feature_names"):
            value = getattr(self, name)
            if isinstance(value, (str, int)):
                raise ConfigError(f"{name} must be a list of columns, got the single {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        if (
            not isinstance(self.delimiter, str)
            or not self.delimiter
            or any(c in self.delimiter for c in "\r\n")
        ):
            raise ConfigError(
                f"delimiter must be a non-empty string without newlines, got {self.delimiter!r}"
            )
        _check_column(self.label_column, "label_column", self.has_header)
        for ref in self.dense_columns:
            _check_column(ref, "dense column", self.has_header)
        for ref in self.categorical_columns:
            _check_column(ref, "categorical column", self.has_header)
        if not self.categorical_columns:
            raise ConfigError("categorical_columns is empty; a model needs at least one")
        refs = [self.label_column, *self.dense_columns, *self.categorical_columns]
        repeated = sorted({str(r) for r in refs if refs.count(r) > 1})
        if repeated:
            raise ConfigError(f"columns used more than once: {repeated}; list each once")
        self._check_features()
        self._check_options()

    @property
    def names(self) -> tuple[str, ...]:
        """The feature names, as defaulted at construction (never None once built)."""
        assert self.feature_names is not None
        return self.feature_names

    def _check_features(self) -> None:
        if self.feature_names is None:
            names = tuple(
                ref if isinstance(ref, str) else f"C{i + 1}"
                for i, ref in enumerate(self.categorical_columns)
            )
            object.__setattr__(self, "feature_names", names)
        names = self.names
        if len(names) != len(self.categorical_columns):
            raise ConfigError(
                f"feature_names has {len(names)} names for {len(self.categorical_columns)} "
                "categorical columns; give one name per categorical column"
            )
        if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise ConfigError(f"feature_names must be unique non-empty strings, got {list(names)}")

    def _check_options(self) -> None:
        if self.categorical_encoding not in CATEGORICAL_ENCODINGS:
            raise ConfigError(
                f"categorical_encoding must be one of {CATEGORICAL_ENCODINGS}, "
                f"got {self.categorical_encoding!r}"
            )
        if self.dense_transform not in DENSE_TRANSFORMS:
            raise ConfigError(
                f"dense_transform must be one of {DENSE_TRANSFORMS}, got {self.dense_transform!r}"
            )
        if self.label_threshold is not None and not (
            isinstance(self.label_threshold, (int, float)) and math.isfinite(self.label_threshold)
        ):
            raise ConfigError(
                f"label_threshold must be a finite number or None, got {self.label_threshold!r}"
            )
        sep = self.multi_value_separator
        if sep is not None and (not isinstance(sep, str) or not sep or sep == self.delimiter):
            raise ConfigError(
                "multi_value_separator must be a non-empty string other than the delimiter "
                f"({self.delimiter!r}), or None; got {sep!r}"
            )
        try:
            codecs.lookup(self.encoding)
        except (LookupError, TypeError) as error:
            raise ConfigError(
                f"unknown text encoding {self.encoding!r}; use e.g. 'utf-8' or 'latin-1'"
            ) from error
        if self.num_columns is not None:
            indices = [
                r
                for r in (self.label_column, *self.dense_columns, *self.categorical_columns)
                if isinstance(r, int)
            ]
            needed = max(indices, default=-1) + 1
            if not isinstance(self.num_columns, int) or self.num_columns < max(needed, 1):
                raise ConfigError(
                    f"num_columns must be an integer >= {max(needed, 1)} (the largest column "
                    f"index used plus one), got {self.num_columns!r}"
                )


class DelimitedDataset(IterableDataset[Batch]):
    """Streams a delimited file as per-rank torchrec batches (``DataLoader(batch_size=None)``).

    Every pass re-reads the file in chunks, so memory stays bounded by the chunk and
    one global batch. Lines are validated whatever the split, so train and val agree
    on which lines are malformed. With ``on_error="skip"``, :attr:`num_skipped` and
    :meth:`skip_summary` describe the last pass (in DataLoader workers they live in
    the worker processes). With ``num_workers > 1`` every worker reads the whole file
    and keeps every ``num_workers``-th batch, so the order of batches is unchanged.

    Args:
        path: The file.
        fmt: Its layout.
        num_embeddings: Rows per feature: an int for all, a sequence in feature order,
            a mapping feature -> rows, or the ModelSpec the model is built from. A
            category lands in row ``hash % rows``.
        batch_size: Examples per batch on this rank.
        split: ``"train"``, ``"val"`` or ``"all"``.
        val_fraction: Share of examples in ``val``, by a stable hash of (seed, index).
        seed: Seed of the split.
        rank: This rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the stream.
        drop_last: Drop an incomplete final global batch (default), else split it.
        on_error: ``"raise"`` a DataFormatError at the first malformed line (file and
            line number named) or ``"skip"`` such lines and count them.
        chunk_rows: Lines parsed at a time.
    """

    def __init__(
        self,
        path: str | Path,
        fmt: DelimitedFormat,
        *,
        num_embeddings: NumEmbeddings,
        batch_size: int,
        split: str = "train",
        val_fraction: float = 0.2,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        on_error: str = "raise",
        chunk_rows: int = 8192,
    ) -> None:
        super().__init__()
        if not isinstance(fmt, DelimitedFormat):
            raise ConfigError(f"fmt must be a DelimitedFormat, got {type(fmt).__name__}")
        check_sharding(batch_size=batch_size, rank=rank, world_size=world_size)
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction <= 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1], got {val_fraction!r}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ConfigError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"data file {str(self.path)!r} does not exist or is not a file")
        self.fmt = fmt
        self.num_embeddings = resolve_num_embeddings(num_embeddings, fmt.names)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.split, self.val_fraction, self.seed = split, float(val_fraction), seed
        self.drop_last, self.on_error, self.chunk_rows = drop_last, on_error, chunk_rows
        self.plan = ColumnPlan.resolve(self.path, fmt)
        self.num_skipped = 0
        self.skipped: list[tuple[int, str]] = []

    @property
    def feature_names(self) -> list[str]:
        """KeyedJaggedTensor keys, in order."""
        return list(self.fmt.names)

    def skip_summary(self) -> str:
        """What the last pass skipped: count and the first few lines with reasons."""
        if not self.num_skipped:
            return f"{self.path}: no malformed lines skipped"
        shown = "; ".join(f"line {line}: {why}" for line, why in self.skipped[:5])
        more = "" if self.num_skipped <= 5 else f"; and {self.num_skipped - 5} more"
        return f"{self.path}: skipped {self.num_skipped} malformed lines ({shown}{more})"

    def _in_split(self, first_index: int, count: int) -> np.ndarray:
        if self.split == "all":
            return np.ones(count, dtype=bool)
        indices = np.arange(first_index, first_index + count, dtype=np.uint64)
        is_val = to_unit(hash_with(key(self.seed, _SPLIT_TAG), indices)) < self.val_fraction
        return is_val if self.split == "val" else ~is_val

    def _on_errors(self, chunk: ParsedChunk) -> None:
        if not chunk.errors:
            return
        if self.on_error == "raise":
            line, why = min(chunk.errors)
            raise DataFormatError(
                f"{self.path}, line {line}: {why} (fix the line, or pass on_error='skip' "
                "to skip malformed lines)"
            )
        self.num_skipped += len(chunk.errors)
        room = _MAX_REPORTED - len(self.skipped)
        if room > 0:
            self.skipped.extend(sorted(chunk.errors)[:room])

    def _blocks(self) -> Iterator[Columns]:
        self.num_skipped = 0
        self.skipped = []
        for chunk in parse_stream(
            read_records(self.path, self.fmt, self.plan),
            plan=self.plan,
            fmt=self.fmt,
            num_embeddings=self.num_embeddings,
            chunk_rows=self.chunk_rows,
        ):
            self._on_errors(chunk)
            mask = self._in_split(chunk.first_index, chunk.num_records)[chunk.valid]
            yield chunk.columns.take(mask)
        if self.num_skipped:
            logger.warning(self.skip_summary())

    def __iter__(self) -> Iterator[Batch]:
        return rank_batches(
            self._blocks(),
            keys=self.feature_names,
            batch_size=self.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )
