"""The plan's enumerations (cluster types, wire compressions, row splits) and the parsers
of its values (enumerations, ranks)."""

from __future__ import annotations

import enum
import operator
from typing import Any

from lightning_embark.errors import ConfigError


class ClusterType(enum.StrEnum):
    """How a cluster's tables exchange data (docs/architecture.md#embedding-clusters)."""

    DP = "dp"
    RB = "rb"
    UB = "ub"


class Compression(enum.StrEnum):
    """Wire format of pooled vectors, unique rows and their gradients."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"

    @property
    def lossless(self) -> bool:
        return self is Compression.FP32


class RowSplit(enum.StrEnum):
    HASH = "hash"
    RANGE = "range"


def _enum(kind: type[enum.StrEnum], value: Any, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(
            f"{what} is {value!r}; choose one of {[m.value for m in kind]}"
        ) from None


def _rank(value: Any, table: str) -> int:
    """``value`` as a rank (any integer type); anything else names the table and the value."""
    try:
        if not isinstance(value, bool):
            return operator.index(value)
    except TypeError:
        pass
    raise ConfigError(f"table {table!r}: rank {value!r} is not an integer; give ranks as integers")
