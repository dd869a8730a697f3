"""Table sizes per feature, from whatever form the caller has them in.

A dataset maps each category to ``hash % rows`` of its feature's table, so it must
know every table's row count; callers hold those as one int, a list, a mapping or
the :class:`~lightning_embark.spec.ModelSpec` the model is built from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec

NumEmbeddings = int | Sequence[int] | Mapping[str, int] | ModelSpec


def resolve_num_embeddings(num_embeddings: NumEmbeddings, features: Sequence[str]) -> list[int]:
    """Rows per feature, in feature order, from an int, a sequence, a mapping or a spec.

    Raises:
        ConfigError: a feature is not covered, a name is unknown, or a count is not a
            positive integer.
    """
    if isinstance(num_embeddings, ModelSpec):
        num_embeddings = {t.feature_name: t.num_embeddings for t in num_embeddings.tables}
    if isinstance(num_embeddings, int) and not isinstance(num_embeddings, bool):
        rows = [num_embeddings] * len(features)
    elif isinstance(num_embeddings, Mapping):
        missing = [f for f in features if f not in num_embeddings]
        unknown = sorted(set(num_embeddings) - set(features))
        if missing or unknown:
            raise ConfigError(
                f"num_embeddings must name exactly the features {list(features)}; "
                f"missing {missing}, unknown {unknown}"
            )
        rows = [num_embeddings[f] for f in features]
    elif isinstance(num_embeddings, Sequence) and not isinstance(num_embeddings, str):
        if len(num_embeddings) != len(features):
            raise ConfigError(
                f"num_embeddings has {len(num_embeddings)} entries for {len(features)} "
                "features; give one per feature, a mapping, or a single int"
            )
        rows = list(num_embeddings)
    else:
        raise ConfigError(
            "num_embeddings must be an int, a sequence, a mapping feature -> rows or a "
            f"ModelSpec, got {num_embeddings!r}"
        )
    for feature, n in zip(features, rows, strict=False):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(
                f"num_embeddings for feature {feature!r} must be a positive integer, got {n!r}"
            )
    return [int(n) for n in rows]
