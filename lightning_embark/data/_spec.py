"""The model spec a CTR file implies: one table per categorical feature, its dense width.

Data modules and recipes both derive it from the same three facts (rows per feature,
number of dense features, embedding width), so the model's tables always match the
rows the reader hashes categories into.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec, TableSpec

#: DLRM's embedding width for the Kaggle Criteo data (``--arch-sparse-feature-size 16``).
DEFAULT_EMBEDDING_DIM = 16


def ctr_spec(
    table_rows: Mapping[str, int],
    *,
    num_dense_features: int,
    embedding_dim: int = DEFAULT_EMBEDDING_DIM,
    name: str = "ctr",
    source: str = "",
) -> ModelSpec:
    """A spec with one ``embedding_dim``-wide table per feature of ``table_rows``.

    Args:
        table_rows: Feature name -> rows, in feature order (tables are named after
            their features, as the reader keys its KeyedJaggedTensor).
        num_dense_features: Dense inputs per example (0 for all-categorical data).
        embedding_dim: Width of every table.
        name: The spec's name.
        source: Where the layout comes from, for reports.

    Raises:
        ConfigError: no features, a row count, the width or the dense count is not a
            positive (non-negative for the dense count) integer.
    """
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise ConfigError(f"embedding_dim must be a positive integer, got {embedding_dim!r}")
    if (
        isinstance(num_dense_features, bool)
        or not isinstance(num_dense_features, int)
        or num_dense_features < 0
    ):
        raise ConfigError(
            f"num_dense_features must be an integer >= 0, got {num_dense_features!r}"
        )
    if not table_rows:
        raise ConfigError("table_rows is empty; a CTR model needs one categorical feature")
    tables = tuple(
        TableSpec(
            name=feature, num_embeddings=rows, embedding_dim=embedding_dim, pooling_factor=1.0
        )
        for feature, rows in table_rows.items()
    )
    return ModelSpec(
        name=name, tables=tables, num_dense_features=num_dense_features, source=source
    )
