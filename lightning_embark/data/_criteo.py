"""Criteo Display Advertising Challenge (DAC) files: format preset, dataset, model spec.

Each line is ``label, I1..I13, C1..C26`` separated by tabs, without a header; any
field but the label may be empty, I2 may be negative, and C1..C26 are 32-bit hashes
written as 8 hex digits. The same layout is used by the Criteo 1TB click logs, so
the preset serves both. Feature names C1..C26 match the tables of the
``mlperf-dlrm-dcnv2`` preset, so a spec loaded from it can size the tables directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_embark.data._delimited import DelimitedDataset, DelimitedFormat
from lightning_embark.data._sizes import NumEmbeddings, resolve_num_embeddings
from lightning_embark.data._spec import DEFAULT_EMBEDDING_DIM, ctr_spec
from lightning_embark.spec import ModelSpec

NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))

#: Rows per table when none are given: the hashing-trick size that keeps 26 tables
#: of width 16 at ~170 MB, small enough for CPU runs, large enough for few collisions
#: on the sample files.
DEFAULT_NUM_EMBEDDINGS = 100_000

CRITEO_FORMAT = DelimitedFormat(
    delimiter="\t",
    has_header=False,
    label_column=0,
    dense_columns=tuple(range(1, 1 + NUM_DENSE)),
    categorical_columns=tuple(range(1 + NUM_DENSE, 1 + NUM_DENSE + NUM_CATEGORICAL)),
    feature_names=CATEGORICAL_NAMES,
    categorical_encoding="hex32",
    dense_transform="log1p",
    quoting=False,
    num_columns=1 + NUM_DENSE + NUM_CATEGORICAL,
)


class CriteoDataset(DelimitedDataset):
    """A Criteo DAC / 1TB file as per-rank torchrec batches (see :class:`DelimitedDataset`).

    Args:
        path: A tab-separated Criteo file.
        num_embeddings: Rows per table: one int for all, 26 ints in C1..C26 order, a
            mapping name -> rows, or the ModelSpec the model is built from.
        batch_size: Examples per batch on this rank.
        missing_dense: What an empty I1..I13 field reads as (default 0.0), or None to
            make such a line malformed (see :class:`DelimitedFormat`).
        missing_categorical: What an empty C1..C26 field gives: ``"empty"`` (default,
            an empty bag), ``"error"`` or ``"id:<hex>"`` (e.g. ``"id:0"``).
        **options: ``split``, ``val_fraction``, ``seed``, ``rank``, ``world_size``,
            ``drop_last``, ``on_error``, ``max_skip_fraction``, ``chunk_rows`` as in
            :class:`DelimitedDataset`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        num_embeddings: NumEmbeddings = DEFAULT_NUM_EMBEDDINGS,
        batch_size: int,
        missing_dense: float | None = CRITEO_FORMAT.missing_dense,
        missing_categorical: str = CRITEO_FORMAT.missing_categorical,
        **options: Any,
    ) -> None:
        fmt = dataclasses.replace(
            CRITEO_FORMAT, missing_dense=missing_dense, missing_categorical=missing_categorical
        )
        super().__init__(
            path, fmt, num_embeddings=num_embeddings, batch_size=batch_size, **options
        )


def criteo_spec(
    num_embeddings: int | Sequence[int] | Mapping[str, int] = DEFAULT_NUM_EMBEDDINGS,
    embedding_dim: int = DEFAULT_EMBEDDING_DIM,
    *,
    name: str = "criteo",
) -> ModelSpec:
    """A model spec for training on Criteo files: tables C1..C26, one ID each, 13 dense.

    Args:
        num_embeddings: Rows per table: one int for all, 26 ints in C1..C26 order, or
            a mapping name -> rows. Pass the same value to :class:`CriteoDataset`.
        embedding_dim: Width of every table.
        name: The spec's name.

    Raises:
        ConfigError: a row count or the width is not a positive integer, or the
            sequence does not have 26 entries.
    """
    rows = resolve_num_embeddings(num_embeddings, CATEGORICAL_NAMES)
    return ctr_spec(
        dict(zip(CATEGORICAL_NAMES, rows, strict=True)),
        num_dense_features=NUM_DENSE,
        embedding_dim=embedding_dim,
        name=name,
        source="Criteo Display Advertising Challenge layout (label, I1..I13, C1..C26)",
    )
