"""The sparse optimizer the engine applies to embedding rows at their owners.

Fused into backward, as torchrec's fused TBE optimizers are, so embedding rows are
never ``nn.Parameter`` s and no dense optimizer sees them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lightning_embark.errors import ConfigError


class OptimizerKind(enum.StrEnum):
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"


@dataclass(frozen=True, kw_only=True)
class SparseOptimizer:
    """The optimizer applied to embedding rows at their owners (fused into backward).

    ``adagrad``: ``s += g**2; w -= lr * g / (sqrt(s) + eps)`` element-wise;
    ``rowwise_adagrad``: one ``s`` per row, ``s += mean(g**2)`` over the row's
    columns (per column shard when a table is split by columns, as in torchrec).
    """

    kind: OptimizerKind = OptimizerKind.SGD
    lr: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", OptimizerKind(self.kind))
        except ValueError:
            raise ConfigError(
                f"sparse optimizer kind {self.kind!r} is unknown; use one of "
                f"{[k.value for k in OptimizerKind]}"
            ) from None
        if not self.lr > 0:
            raise ConfigError(f"sparse optimizer lr must be > 0, got {self.lr!r}")
        if not self.eps > 0:
            raise ConfigError(
                f"sparse optimizer eps must be > 0 (it guards 0/0), got {self.eps!r}"
            )
