"""Lightning's model summary with the sharded embedding tables counted.

Lightning's :class:`~lightning.pytorch.callbacks.ModelSummary` counts
``module.parameters()``. The engine's blocks are plain tensors, not ``nn.Parameter`` s
(so that neither DDP nor the dense optimizer sees them), so a summary taken after
sharding would count the dense layers only: 27.6 K parameters for a model whose tables
hold millions of rows. The summaries here add each sharded collection's logical tables,
``sum(num_embeddings * embedding_dim)`` (one count per table, whatever its replicas), to
the layers that hold it and to the totals. Lightning itself swaps in another summary the
same way (``ModelSummary._summary``) for DeepSpeed's partitioned parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary
from torch import nn


def table_parameters(collections: Mapping[str, nn.Module]) -> dict[str, int]:
    """Path -> ``sum(num_embeddings * embedding_dim)`` over the tables of the collection
    there (sharded or torchrec's: anything with ``embedding_bag_configs()``)."""
    return {
        path: sum(c.num_embeddings * c.embedding_dim for c in module.embedding_bag_configs())  # type: ignore[operator]
        for path, module in collections.items()
    }


class TableCountingSummary(Summary):
    """A Lightning model summary that also counts ``tables``' parameters (trainable: the
    sparse optimizer updates them) in every layer on their path and in the totals.

    Args:
        model: The LightningModule.
        tables: Module path -> parameters held outside ``nn.Parameter`` s there.
        max_depth: As Lightning's summary.
    """

    def __init__(
        self, model: pl.LightningModule, *, tables: Mapping[str, int], max_depth: int = 1
    ) -> None:
        self._tables = dict(tables)
        super().__init__(model, max_depth=max_depth)

    def _held_under(self, layer: str) -> int:
        return sum(n for path, n in self._tables.items() if f"{path}.".startswith(f"{layer}."))

    @property
    def param_nums(self) -> list[int]:
        return [
            n + self._held_under(name)
            for name, n in zip(self.layer_names, super().param_nums, strict=True)
        ]

    @property
    def total_parameters(self) -> int:
        return super().total_parameters + sum(self._tables.values())

    @property
    def trainable_parameters(self) -> int:
        return super().trainable_parameters + sum(self._tables.values())


class _CountsTables:
    """Makes a Lightning summary callback summarize with :class:`TableCountingSummary`,
    taking the tables from the strategy's ``sharded_modules`` (none: Lightning's count)."""

    _max_depth: int

    def _summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Summary:
        sharded = getattr(trainer.strategy, "sharded_modules", None) or {}
        return TableCountingSummary(
            pl_module, tables=table_parameters(sharded), max_depth=self._max_depth
        )


class EmbarkModelSummary(_CountsTables, ModelSummary):
    """:class:`~lightning.pytorch.callbacks.ModelSummary` counting the sharded tables."""


class EmbarkRichModelSummary(_CountsTables, RichModelSummary):
    """:class:`~lightning.pytorch.callbacks.RichModelSummary` counting the sharded tables."""


#: Lightning's summary callbacks and their table-counting counterparts.
TABLE_COUNTING: dict[type[ModelSummary], type[ModelSummary]] = {
    ModelSummary: EmbarkModelSummary,
    RichModelSummary: EmbarkRichModelSummary,
}


def counting_tables(callback: Any) -> Any:
    """``callback`` itself, or, for one of Lightning's own summary callbacks (exactly its
    type: a user's subclass is left alone), its table-counting counterpart with the same
    settings (``max_depth``, theme, ...)."""
    counterpart = TABLE_COUNTING.get(type(callback))
    if counterpart is None:
        return callback
    replacement = counterpart.__new__(counterpart)
    replacement.__dict__.update(vars(callback))
    return replacement
