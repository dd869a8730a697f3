"""The description of a delimited file: where its label, dense and categorical columns
are, and how their text turns into numbers (:class:`DelimitedFormat`).

Kept apart from the reader so that the parser and the dataset both take it without
importing each other.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_embark.errors import ConfigError

ColumnRef = str | int

CATEGORICAL_ENCODINGS = ("hex32", "string", "int", "libfm")
DENSE_TRANSFORMS = ("log1p", "none")
#: ``missing_categorical`` values other than ``"id:<value>"``.
MISSING_CATEGORICAL = ("empty", "error")
_ID_PREFIX = "id:"


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
            ``"int"`` (decimal integers such as user IDs, used as they are) or
            ``"libfm"`` (libFM's ``index:value`` pairs of one-hot fields, as the NFM
            papers' files write them, one field per position: the index is the ID; a
            value other than 1 would weigh the row, which a bag cannot, and is
            refused). :func:`libfm_format` describes such a file.
        dense_transform: ``"log1p"`` (DLRM's ``log(1 + max(x, 0))``) or ``"none"``.
        label_threshold: If set, label = value >= threshold (e.g. ratings >= 4);
            otherwise the value itself, which must lie in [0, 1].
        multi_value_separator: If set, a categorical field holds several values
            (e.g. ``"|"`` for MovieLens genres), all put in one bag.
        encoding: Text encoding (``latin-1`` for some MovieLens files).
        quoting: Whether ``"`` quotes fields (one-character delimiters only).
        num_columns: Expected fields per line; default the header's count, or the
            first line's when there is no header.
        missing_dense: What an empty dense field reads as, before ``dense_transform``:
            a number (default 0.0, DLRM's convention for Criteo, so log1p gives 0), or
            None to make such a line malformed (raised or skipped per ``on_error``).
        missing_categorical: What an empty categorical field gives: ``"empty"``
            (default: an empty bag, so the feature adds a zero vector), ``"error"``
            (the line is malformed), or ``"id:<value>"``: the category ``<value>``,
            written in ``categorical_encoding`` (e.g. ``"id:0"`` for ``hex32`` and
            ``int``, as torchrec's Criteo preprocessing does), so every missing value
            shares one learned row.
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
    missing_dense: float | None = 0.0
    missing_categorical: str = "empty"

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
        self._check_missing()

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

    @property
    def missing_token(self) -> str | None:
        """The text an empty categorical field is read as (``"id:<value>"``), else None."""
        if self.missing_categorical.startswith(_ID_PREFIX):
            return self.missing_categorical.removeprefix(_ID_PREFIX)
        return None

    def _check_missing(self) -> None:
        dense = self.missing_dense
        if dense is not None and (
            isinstance(dense, bool)
            or not isinstance(dense, (int, float))
            or not math.isfinite(dense)
        ):
            raise ConfigError(
                f"missing_dense must be a finite number (what an empty dense field reads as) "
                f"or None (an empty dense field makes the line malformed), got {dense!r}"
            )
        choice = self.missing_categorical
        expected = (
            f"missing_categorical must be 'empty' (an empty bag), 'error' (the line is "
            f"malformed) or 'id:<value>' (that category), got {choice!r}"
        )
        if not isinstance(choice, str):
            raise ConfigError(expected)
        token = self.missing_token
        if token is None:
            if choice not in MISSING_CATEGORICAL:
                raise ConfigError(expected)
            return
        if not token or any(c in token for c in (self.delimiter, "\r", "\n")):
            raise ConfigError(f"{expected}: the value after 'id:' must be non-empty field text")
        if self.multi_value_separator is not None and self.multi_value_separator in token:
            raise ConfigError(
                f"{expected}: the value holds multi_value_separator "
                f"{self.multi_value_separator!r}; give one category"
            )
        try:
            code = int(token, 16) if self.categorical_encoding == "hex32" else None
            if self.categorical_encoding == "int":
                int(token)
            if self.categorical_encoding == "libfm":
                libfm_index(token)
        except ValueError as error:
            raise ConfigError(
                f"missing_categorical={choice!r}: {token!r} is not a valid "
                f"{self.categorical_encoding} ID (categorical_encoding="
                f"{self.categorical_encoding!r}); write it as the column's values are written"
            ) from error
        if code is not None and not 0 <= code <= 0xFFFFFFFF:
            raise ConfigError(
                f"missing_categorical={choice!r}: {token!r} is not a 32-bit hexadecimal ID"
            )


def libfm_index(token: str) -> int:
    """The feature index of a libFM one-hot pair ``index:1``.

    Raises:
        ValueError: not ``index:value`` with a non-negative integer index and value 1.
    """
    index, sep, value = token.partition(":")
    if not sep or float(value) != 1.0:
        raise ValueError(token)
    out = int(index)
    if out < 0:
        raise ValueError(token)
    return out


def libfm_format(fields: int | Sequence[str], *, label_threshold: float = 0.5) -> DelimitedFormat:
    """The format of a positional libFM file: ``label index:1 index:1 ...``, space
    separated, one one-hot field per position after the label (the layout of the NFM
    papers' Frappe and MovieLens files).

    Each field becomes one categorical feature whose IDs are the libFM indices
    (global over the file: size its table to the largest index + 1 to keep them
    apart, or smaller to hash them). The label is a click when it is at least
    ``label_threshold``: the default 0.5 reads libFM's ``1`` / ``-1`` and ``1`` / ``0``
    labels alike.

    Args:
        fields: The number of fields (features ``F1, F2, ...``) or their names.
        label_threshold: The smallest label that is a click.

    Raises:
        ConfigError: no field, or names that are not unique.
    """
    names = tuple(f"F{i + 1}" for i in range(fields)) if isinstance(fields, int) else tuple(fields)
    if not names:
        raise ConfigError("a libFM format needs at least one field")
    return DelimitedFormat(
        delimiter=" ",
        has_header=False,
        label_column=0,
        categorical_columns=tuple(range(1, len(names) + 1)),
        feature_names=names,
        categorical_encoding="libfm",
        dense_transform="none",
        label_threshold=label_threshold,
        quoting=False,
        num_columns=len(names) + 1,
    )
