"""Reading delimited lines and turning chunks of them into columnar blocks.

Kept apart from :mod:`lightning_embark.data._delimited` so that the format and the
dataset stay readable. Conversion is column by column with a fast path (one list
comprehension per column) and a slow path that runs only when a chunk holds a bad
value, to find exactly which lines are wrong and why.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lightning_embark.data._columns import Columns
from lightning_embark.data._format import DelimitedFormat, libfm_index
from lightning_embark.data._hashing import stable_string_hash
from lightning_embark.errors import DataFormatError

Record = tuple[int, list[str] | None, str | None]
_HEX32_MAX = 0xFFFFFFFF


def _open(path: Path, encoding: str):
    return path.open("r", encoding=encoding, newline="")


def _lines(handle, delimiter: str, quoting: bool) -> Iterator[Record]:
    """(1-based line number, fields or None, problem or None) per non-blank line."""
    if len(delimiter) > 1:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if line:
                yield number, line.split(delimiter), None
        return
    mode: Literal[0, 3] = csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE
    reader = csv.reader(handle, delimiter=delimiter, quoting=mode)
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            yield reader.line_num, None, f"unreadable field ({error})"
            continue
        if fields:
            yield reader.line_num, fields, None


def _guarded(path: Path, encoding: str, records: Iterator[Record]) -> Iterator[Record]:
    last = 0
    try:
        for record in records:
            last = record[0]
            yield record
    except UnicodeDecodeError as error:
        raise DataFormatError(
            f"{path}, after line {last}: text is not valid {encoding} ({error.reason}); "
            "set DelimitedFormat(encoding=...) to the file's encoding, e.g. 'latin-1'"
        ) from error


def first_fields(
    path: Path, *, delimiter: str, quoting: bool = True, encoding: str = "utf-8"
) -> tuple[int, list[str]]:
    """The first non-blank line of ``path`` (the header, when there is one): its 1-based
    number and its fields, split as every data line is (see :class:`DelimitedFormat`).

    Raises:
        DataFormatError: the file is empty, its first line is unreadable, or its text
            is not valid ``encoding``.
    """
    with _open(path, encoding) as handle:
        first = next(_guarded(path, encoding, _lines(handle, delimiter, quoting)), None)
    if first is None or first[1] is None:
        raise DataFormatError(f"{path}: file is empty or its first line is unreadable")
    return first[0], first[1]


@dataclass(frozen=True, kw_only=True)
class ColumnPlan:
    """Column indices resolved against a file's header (or first line)."""

    label: int
    dense: tuple[int, ...]
    categorical: tuple[int, ...]
    num_columns: int
    header: tuple[str, ...] | None

    @classmethod
    def resolve(cls, path: Path, fmt: DelimitedFormat) -> ColumnPlan:
        """Read the header or first line of ``path`` and fix every column's index.

        Raises:
            DataFormatError: the file is empty, a named column is absent from the
                header, or an index lies beyond the line's fields.
        """
        line, fields = first_fields(
            path, delimiter=fmt.delimiter, quoting=fmt.quoting, encoding=fmt.encoding
        )
        header = tuple(f.strip() for f in fields) if fmt.has_header else None
        num_columns = fmt.num_columns or len(fields)
        if header is not None and len(header) != num_columns:
            raise DataFormatError(
                f"{path}, line {line}: header has {len(header)} columns but "
                f"num_columns={num_columns}; fix num_columns or the header"
            )

        def index(ref: str | int) -> int:
            if isinstance(ref, str):
                if header is None or ref not in header:
                    raise DataFormatError(
                        f"{path}, line {line}: header has no column {ref!r}; "
                        f"its columns are {list(header or ())}"
                    )
                return header.index(ref)
            if ref >= num_columns:
                raise DataFormatError(
                    f"{path}, line {line}: column index {ref} is out of range for "
                    f"{num_columns} fields separated by {fmt.delimiter!r} (indices are 0-based; "
                    "is the delimiter the file's?)"
                )
            return ref

        return cls(
            label=index(fmt.label_column),
            dense=tuple(index(r) for r in fmt.dense_columns),
            categorical=tuple(index(r) for r in fmt.categorical_columns),
            num_columns=num_columns,
            header=header,
        )

    def describe(self, column: int) -> str:
        """A column as users know it: its header name and index."""
        if self.header is not None:
            return f"{self.header[column]!r} (index {column})"
        return f"index {column}"


def read_records(path: Path, fmt: DelimitedFormat, plan: ColumnPlan) -> Iterator[Record]:
    """Data lines of ``path`` after any header, each with its 1-based line number."""
    with _open(path, fmt.encoding) as handle:
        records = _guarded(path, fmt.encoding, _lines(handle, fmt.delimiter, fmt.quoting))
        if fmt.has_header:
            next(records, None)
        yield from records


@dataclass(frozen=True, kw_only=True)
class ParsedChunk:
    """One chunk of lines: the valid ones as columns, the others as (line, why)."""

    columns: Columns
    errors: list[tuple[int, str]]
    first_index: int
    valid: np.ndarray

    @property
    def num_records(self) -> int:
        """Lines in the chunk, valid or not (each is one example index)."""
        return int(self.valid.shape[0])


def _convert(
    raw: Sequence[str], convert: Callable[[str], float | int], on_bad: Callable[[str], str]
) -> tuple[list, dict[int, str]]:
    try:
        return [convert(v) for v in raw], {}
    except (ValueError, OverflowError):
        out: list = []
        bad: dict[int, str] = {}
        for position, value in enumerate(raw):
            try:
                out.append(convert(value))
            except (ValueError, OverflowError):
                out.append(0)
                bad[position] = on_bad(value)
        return out, bad


def _dense_reader(missing: float | None) -> Callable[[str], float]:
    """``float``, reading an empty field as ``missing`` (None: empty fields are bad)."""
    if missing is None:
        return float
    default = float(missing)
    return lambda text: float(text) if text else default


class _ChunkParser:
    """Parses the well-formed-looking rows of one chunk, recording bad values."""

    def __init__(self, fmt: DelimitedFormat, plan: ColumnPlan, rows: list[list[str]]) -> None:
        self.fmt, self.plan, self.num_rows = fmt, plan, len(rows)
        # One C-level transpose instead of a Python loop per column.
        self.columns: list[tuple[str, ...]] = (
            list(zip(*rows, strict=False)) if rows else [() for _ in range(plan.num_columns)]
        )
        self.bad: dict[int, str] = {}

    def _note(self, row: int, why: str) -> None:
        """Keep the first problem found on a row (label, then dense, then categorical)."""
        self.bad.setdefault(int(row), why)

    def numbers(self, column: int, convert: Callable[[str], float], what: str) -> np.ndarray:
        """A numeric column as float64; unparsable or non-finite values are noted, read as 0."""
        raw = self.columns[column]
        where = self.plan.describe(column)
        values, bad = _convert(raw, convert, lambda v: self._unparsable(where, v, what))
        for row, why in bad.items():
            self._note(row, why)
        array = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(array)
        for row in np.flatnonzero(~finite).tolist():
            self._note(row, f"column {where}: {raw[row]!r} is not a finite number")
        return np.where(finite, array, 0.0)

    @staticmethod
    def _unparsable(where: str, value: str, what: str) -> str:
        if value == "":
            return f"column {where}: empty value where {what} is expected"
        return f"column {where}: cannot parse {value!r} as {what}"

    def labels(self) -> np.ndarray:
        """Labels as float32 0/1 (thresholded) or as given, which must lie in [0, 1]."""
        values = self.numbers(self.plan.label, float, "a number (label)")
        threshold = self.fmt.label_threshold
        if threshold is not None:
            return (values >= threshold).astype(np.float32)
        where = self.plan.describe(self.plan.label)
        for row in np.flatnonzero((values < 0) | (values > 1)).tolist():
            self._note(
                row,
                f"column {where}: label {values[row]:g} is not in [0, 1] "
                "(set DelimitedFormat(label_threshold=...) for ratings)",
            )
        return values.astype(np.float32)

    def dense(self) -> np.ndarray:
        """Dense features ``[n, num_dense]`` float32; empty fields read as ``missing_dense``."""
        read = _dense_reader(self.fmt.missing_dense)
        what = "a number (missing_dense=None)" if self.fmt.missing_dense is None else "a number"
        columns = [self.numbers(c, read, what) for c in self.plan.dense]
        if not columns:
            return np.zeros((self.num_rows, 0), dtype=np.float32)
        dense = np.stack(columns, axis=1)
        if self.fmt.dense_transform == "log1p":
            dense = np.log1p(np.maximum(dense, 0.0))
        return dense.astype(np.float32)

    def categorical(self, column: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Bag lengths per row and table rows (``code % rows``); empty fields follow
        ``missing_categorical`` (an empty bag, a bad line, or one fixed category)."""
        raw = self.columns[column]
        where = self.plan.describe(column)
        if self.fmt.missing_categorical == "error":
            for row in (i for i, v in enumerate(raw) if v == ""):
                self._note(row, f"column {where}: empty value (missing_categorical='error')")
        token = self.fmt.missing_token
        if token is not None:
            raw = tuple(token if v == "" else v for v in raw)
        sep = self.fmt.multi_value_separator
        if sep is None:
            lengths = np.fromiter((v != "" for v in raw), dtype=np.int64, count=len(raw))
            tokens = [v for v in raw if v]
        else:
            bags = [[t for t in v.split(sep) if t] for v in raw]
            lengths = np.fromiter((len(b) for b in bags), dtype=np.int64, count=len(bags))
            tokens = [t for b in bags for t in b]
        owner = np.repeat(np.arange(len(raw)), lengths)
        encoding = self.fmt.categorical_encoding
        if encoding == "hex32":
            codes, bad = _convert(
                tokens,
                lambda v: int(v, 16),
                lambda v: (
                    f"column {where}: {v!r} is not a hexadecimal ID (categorical_encoding="
                    "'hex32'; 'string' reads any text)"
                ),
            )
        elif encoding == "int":
            codes, bad = _convert(
                tokens,
                lambda v: int(v) % rows,
                lambda v: f"column {where}: {v!r} is not an integer ID",
            )
        elif encoding == "libfm":
            codes, bad = _convert(
                tokens,
                lambda v: libfm_index(v) % rows,
                lambda v: (
                    f"column {where}: {v!r} is not a libFM one-hot pair 'index:1' "
                    "(categorical_encoding='libfm'; a weighted feature cannot be a bag's ID)"
                ),
            )
        else:
            codes, bad = [stable_string_hash(v) for v in tokens], {}
        for position, why in bad.items():
            self._note(owner[position], why)
        array = np.asarray(codes, dtype=np.int64) if codes else np.zeros(0, np.int64)
        if encoding == "hex32":
            wide = (array < 0) | (array > _HEX32_MAX)
            for position in np.flatnonzero(wide).tolist():
                self._note(
                    owner[position],
                    f"column {where}: {tokens[position]!r} is not a 32-bit hexadecimal ID",
                )
            array = np.where(wide, 0, array)
        return lengths, array % rows


def _parse(
    records: list[Record],
    first_index: int,
    *,
    fmt: DelimitedFormat,
    plan: ColumnPlan,
    num_embeddings: Sequence[int],
) -> ParsedChunk:
    errors: list[tuple[int, str]] = []
    rows: list[list[str]] = []
    lines: list[int] = []
    valid = np.zeros(len(records), dtype=bool)
    kept: list[int] = []
    for position, (line, fields, problem) in enumerate(records):
        if fields is not None and len(fields) != plan.num_columns:
            problem = (
                f"expected {plan.num_columns} fields separated by {fmt.delimiter!r}, "
                f"got {len(fields)}"
            )
        if problem is not None or fields is None:
            errors.append((line, problem or "unreadable line"))
            continue
        rows.append(fields)
        lines.append(line)
        kept.append(position)
    parser = _ChunkParser(fmt, plan, rows)
    labels = parser.labels()
    dense = parser.dense()
    sparse = [
        parser.categorical(c, n) for c, n in zip(plan.categorical, num_embeddings, strict=False)
    ]
    columns = Columns(
        dense=dense,
        labels=labels,
        lengths=tuple(s[0] for s in sparse),
        values=tuple(s[1] for s in sparse),
    )
    ok = np.ones(len(rows), dtype=bool)
    for row, why in parser.bad.items():
        ok[row] = False
        errors.append((lines[row], why))
    valid[np.asarray(kept, dtype=np.int64)[ok]] = True
    return ParsedChunk(
        columns=columns.take(ok), errors=errors, first_index=first_index, valid=valid
    )


def parse_stream(
    records: Iterable[Record],
    *,
    fmt: DelimitedFormat,
    plan: ColumnPlan,
    num_embeddings: Sequence[int],
    chunk_rows: int,
) -> Iterator[ParsedChunk]:
    """Parse ``records`` ``chunk_rows`` at a time; every record is one example index."""
    chunk: list[Record] = []
    first_index = 0
    for record in records:
        chunk.append(record)
        if len(chunk) == chunk_rows:
            yield _parse(chunk, first_index, fmt=fmt, plan=plan, num_embeddings=num_embeddings)
            first_index += len(chunk)
            chunk = []
    if chunk:
        yield _parse(chunk, first_index, fmt=fmt, plan=plan, num_embeddings=num_embeddings)
