"""A generic reader for delimited CTR data (CSV, TSV, ``::``), streamed as torchrec batches.

One :class:`DelimitedFormat` describes where the label, the dense and the categorical
columns are and how to turn their text into numbers; :class:`DelimitedDataset` streams
a file in chunks, splits it into train/val by a stable hash of the example index (no
need to know the file length), and cuts it into per-rank batches following the
sharding rule of :mod:`lightning_embark.data._columns`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from lightning_embark.data._columns import Columns, check_sharding, rank_batches
from lightning_embark.data._format import DelimitedFormat
from lightning_embark.data._hashing import in_split
from lightning_embark.data._parsing import ColumnPlan, ParsedChunk, parse_stream, read_records
from lightning_embark.data._sizes import NumEmbeddings, resolve_num_embeddings
from lightning_embark.errors import ConfigError, DataFormatError

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "all")
_MAX_REPORTED = 20
#: Default share of a file's lines that ``on_error="skip"`` may skip in one pass.
DEFAULT_MAX_SKIP_FRACTION = 0.01


class DelimitedDataset(IterableDataset[Batch]):
    """Streams a delimited file as per-rank torchrec batches (``DataLoader(batch_size=None)``).

    Every pass re-reads the file in chunks, so memory stays bounded by the chunk and
    one global batch. Lines are validated whatever the split, so train and val agree
    on which lines are malformed. With ``on_error="skip"``, :attr:`num_skipped`,
    :attr:`num_lines` and :meth:`skip_summary` describe the last pass (in DataLoader
    workers they live in the worker processes). With ``num_workers > 1`` every worker
    reads the whole file and keeps every ``num_workers``-th batch, so the order of
    batches is unchanged.

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
        max_skip_fraction: With ``on_error="skip"``, the largest share of the file's
            data lines a pass may skip; a pass that skips more, or skips every line
            whatever this says, raises a DataFormatError at its end (counts and the
            first bad line named) instead of training on what is left. The default
            1% passes the odd damaged line of a large file, while a wrong delimiter,
            column list or encoding, which breaks most lines, fails loudly.
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
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
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
        if (
            isinstance(max_skip_fraction, bool)
            or not isinstance(max_skip_fraction, (int, float))
            or not 0.0 <= max_skip_fraction <= 1.0
        ):
            raise ConfigError(
                f"max_skip_fraction must be a number in [0, 1] (a share of the file's lines), "
                f"got {max_skip_fraction!r}"
            )
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
        self.max_skip_fraction = float(max_skip_fraction)
        self.plan = ColumnPlan.resolve(self.path, fmt)
        self.num_skipped = 0
        self.num_lines = 0
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
        return (
            f"{self.path}: skipped {self.num_skipped} malformed lines of {self.num_lines} "
            f"({shown}{more})"
        )

    def _check_skipped(self) -> None:
        """Refuse a pass that skipped every line, or more than ``max_skip_fraction`` of them.

        Such a pass is a format that does not fit the file (delimiter, columns,
        encoding), not a few damaged lines; training on the remainder, or on nothing,
        would finish "successfully" with no or misleading metrics.
        """
        if not self.num_skipped:
            return
        fraction = self.num_skipped / self.num_lines
        if self.num_skipped < self.num_lines and fraction <= self.max_skip_fraction:
            return
        line, why = self.skipped[0]
        if self.num_skipped == self.num_lines:
            what = f"every one of its {self.num_lines} data lines is malformed"
        else:
            what = (
                f"skipped {self.num_skipped} of {self.num_lines} data lines ({fraction:.1%}), "
                f"more than max_skip_fraction={self.max_skip_fraction:g} allows"
            )
        raise DataFormatError(
            f"{self.path}: {what}; the first bad line is line {line}: {why}. Check that the "
            "format (delimiter, columns, encoding, header) fits the file"
            + (
                ""
                if self.num_skipped == self.num_lines
                else ", or raise max_skip_fraction if that many bad lines are expected"
            )
        )

    def _in_split(self, first_index: int, count: int) -> np.ndarray:
        return in_split(
            self.split,
            seed=self.seed,
            val_fraction=self.val_fraction,
            first_index=first_index,
            count=count,
        )

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
        self.num_lines = 0
        self.skipped = []
        for chunk in parse_stream(
            read_records(self.path, self.fmt, self.plan),
            plan=self.plan,
            fmt=self.fmt,
            num_embeddings=self.num_embeddings,
            chunk_rows=self.chunk_rows,
        ):
            self.num_lines += chunk.num_records
            self._on_errors(chunk)
            mask = self._in_split(chunk.first_index, chunk.num_records)[chunk.valid]
            yield chunk.columns.take(mask)
        self._check_skipped()
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
