"""A LightningDataModule over any delimited CTR file (CSV, TSV, ``::``), named by its columns.

:class:`DelimitedDataModule` turns flat options (what a command line or a YAML config
holds) into a :class:`~lightning_embark.data.DelimitedFormat` and serves the split,
sharded loaders of :class:`~lightning_embark.data._ctr_module.CTRDataModule`. The
model is derived from it (:meth:`~CTRDataModule.model_spec`: one table per
categorical column, the dense width), so the tables always match the rows the reader
hashes into.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_embark.data._criteo import DEFAULT_NUM_EMBEDDINGS
from lightning_embark.data._ctr_module import CTRDataModule, check_file
from lightning_embark.data._delimited import DEFAULT_MAX_SKIP_FRACTION
from lightning_embark.data._format import ColumnRef, DelimitedFormat
from lightning_embark.data._parsing import first_fields
from lightning_embark.errors import ConfigError, DataFormatError


def _columns(value: object, option: str) -> tuple[ColumnRef, ...]:
    if isinstance(value, (str, int)) or not isinstance(value, Sequence):
        raise ConfigError(
            f"{option} must be a list of column names or 0-based indices (e.g. [1, 2] or "
            f"[price, age]), got {value!r}"
        )
    return tuple(value)


def other_columns(
    path: Path,
    *,
    delimiter: str,
    header: bool,
    label: ColumnRef,
    dense: Sequence[ColumnRef],
    quoting: bool,
    encoding: str,
    num_columns: int | None,
) -> tuple[ColumnRef, ...]:
    """Every column of ``path`` but the label and the dense ones, in file order: by
    name when the file has a header, else by 0-based index.

    Raises:
        DataFormatError: no column is left, which means the delimiter (or the header
            setting) does not fit the file.
    """
    line, fields = first_fields(path, delimiter=delimiter, quoting=quoting, encoding=encoding)
    count = len(fields) if header else (num_columns or len(fields))
    names = [f.strip() for f in fields] if header else None
    used = {label, *dense}
    left: list[ColumnRef] = []
    for index in range(count):
        name = names[index] if names is not None else None
        if index in used or name in used:
            continue
        left.append(name if name is not None else index)
    if not left:
        raise DataFormatError(
            f"{path}, line {line}: {len(fields)} field(s) separated by {delimiter!r}, and "
            f"the label ({label!r}) and {len(dense)} dense column(s) leave none for "
            "categorical features; check --data.delimiter and --data.header, or list "
            "--data.categorical"
        )
    return tuple(left)


class DelimitedDataModule(CTRDataModule):
    """Train, validation and predict loaders over a delimited CTR file, sharded over ranks.

    Columns are named (``header=True``) or 0-based indices. The label is a click (0/1,
    or any value in [0, 1]; ``label_threshold`` turns ratings into clicks), the dense
    columns are numbers (``log1p`` by default), and each categorical column feeds one
    hashed table of ``num_embeddings`` rows.

    Args:
        path: The delimited CTR file (CSV, TSV, ...), one example per line.
        delimiter: Field separator (``","``, ``"\\t"``, ``"::"``, ...).
        header: Whether the first line names the columns.
        label: Name or 0-based index of the label column.
        dense: Names or indices of the dense columns; may be empty (all-categorical
            data).
        categorical: Names or indices of the categorical columns; None: every column
            but the label and the dense ones (read from the header or first line).
        num_embeddings: Rows per table: one int for all, or a mapping feature -> rows.
            Features are the header names of the categorical columns, or ``C1, C2, ...``
            when they are given by index.
        batch_size: Examples per rank per step (the global batch is this times the
            world size).
        categorical_encoding: ``"string"`` (any text, CRC-32 hashed), ``"hex32"``
            (Criteo's 8-hex-digit hashes), ``"int"`` (decimal IDs) or ``"libfm"``
            (positional libFM one-hot pairs ``index:1``; with ``delimiter=" "``,
            ``dense=[]`` and ``label_threshold=0.5`` for its ``1`` / ``-1`` labels).
        dense_transform: ``"log1p"`` (``log(1 + max(x, 0))``) or ``"none"``.
        label_threshold: If set, the label is ``value >= label_threshold``.
        multi_value_separator: If set, a categorical field holds several values, all
            in one bag (e.g. ``"|"``).
        encoding: Text encoding of the file.
        quoting: Whether ``"`` quotes fields (one-character delimiters only).
        num_columns: Fields per line; None: the header's or first line's count.
        missing_dense: What an empty dense field reads as, or None to make such a
            line malformed.
        missing_categorical: What an empty categorical field gives: ``"empty"`` (an
            empty bag), ``"error"`` or ``"id:<value>"`` (that category).
        val_fraction: Share of the lines in the validation split (by a stable hash of
            the line index, so the split does not depend on ranks or batch size).
        split_seed: Seed of that split.
        drop_last_train: Drop the incomplete last global training batch (default), so
            every step has the same global batch size.
        on_error: ``"raise"`` at the first malformed line, or ``"skip"`` such lines.
        max_skip_fraction: With ``on_error="skip"``, the largest share of the file's
            lines a pass may skip; more, or every line, raises a DataFormatError.
        num_workers: DataLoader worker processes per rank (0: parse in the rank).
        predict_path: The file ``predict`` reads (same layout, labels included; every
            line, in order); None: ``path``.

    Raises:
        ConfigError: an option is invalid or the file does not exist.
        DataFormatError: the header or first line does not fit the columns given.
    """

    def __init__(
        self,
        path: str,
        *,
        delimiter: str = ",",
        header: bool = False,
        label: int | str = 0,
        dense: Sequence[int | str] = (),
        categorical: Sequence[int | str] | None = None,
        num_embeddings: int | Mapping[str, int] = DEFAULT_NUM_EMBEDDINGS,
        batch_size: int = 128,
        categorical_encoding: str = "string",
        dense_transform: str = "log1p",
        label_threshold: float | None = None,
        multi_value_separator: str | None = None,
        encoding: str = "utf-8",
        quoting: bool = True,
        num_columns: int | None = None,
        missing_dense: float | None = 0.0,
        missing_categorical: str = "empty",
        val_fraction: float = 0.2,
        split_seed: int = 0,
        drop_last_train: bool = True,
        on_error: str = "raise",
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
        num_workers: int = 0,
        predict_path: str | None = None,
    ) -> None:
        check_file(path, self.file_kind, "--data.path")
        dense_columns = _columns(dense, "dense")
        if categorical is None:
            if not isinstance(delimiter, str) or not delimiter:
                raise ConfigError(f"delimiter must be a non-empty string, got {delimiter!r}")
            try:
                categorical_columns = other_columns(
                    Path(path),
                    delimiter=delimiter,
                    header=header,
                    label=label,
                    dense=dense_columns,
                    quoting=quoting,
                    encoding=encoding,
                    num_columns=num_columns,
                )
            except LookupError as error:
                raise ConfigError(
                    f"unknown text encoding {encoding!r}; use e.g. 'utf-8' or 'latin-1'"
                ) from error
        else:
            categorical_columns = _columns(categorical, "categorical")
        fmt = DelimitedFormat(
            delimiter=delimiter,
            has_header=header,
            label_column=label,
            dense_columns=dense_columns,
            categorical_columns=categorical_columns,
            categorical_encoding=categorical_encoding,
            dense_transform=dense_transform,
            label_threshold=label_threshold,
            multi_value_separator=multi_value_separator,
            encoding=encoding,
            quoting=quoting,
            num_columns=num_columns,
            missing_dense=missing_dense,
            missing_categorical=missing_categorical,
        )
        super().__init__(
            path,
            fmt,
            batch_size=batch_size,
            num_embeddings=num_embeddings,
            val_fraction=val_fraction,
            split_seed=split_seed,
            drop_last_train=drop_last_train,
            on_error=on_error,
            max_skip_fraction=max_skip_fraction,
            num_workers=num_workers,
            predict_path=predict_path,
        )
        self.save_hyperparameters()
