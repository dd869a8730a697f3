"""The callbacks a ``strategy="embark"`` Trainer runs with: the per-step metrics the
strategy promises, and a model summary that counts the sharded tables.

The strategy calls :func:`with_embark_callbacks` at setup, before Lightning's
``on_fit_start`` hooks run, so what it adds starts with the fit like a callback the user
passed. Each callback type appears once: one the user already passed is kept as it is
(with its own options) and not added again.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import Checkpoint

from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.sharding._metrics import EmbarkMetricsCallback
from lightning_embark.sharding._model_summary import counting_tables


def with_embark_callbacks(
    callbacks: Sequence[Callback], *, metrics: bool, ranks_per_host: int
) -> list[Callback]:
    """``callbacks`` with Lightning's summary callbacks made to count the sharded tables
    and, when ``metrics``, a :class:`~lightning_embark.accounting.CommAccountingCallback`
    (bytes intra-/inter-host, exchange time) and an :class:`EmbarkMetricsCallback`
    (engine and dense time, unique ratios) unless ``callbacks`` already has one.

    Added callbacks go before the first checkpoint callback, where Lightning keeps
    checkpoints (last, so they see every metric of the step).

    Args:
        callbacks: The trainer's callbacks.
        metrics: Whether to add the metrics callbacks.
        ranks_per_host: The launch's rank-to-host map, for the byte counter.
    """
    out = [counting_tables(callback) for callback in callbacks]
    if not metrics:
        return out
    wanted: list[Callback] = [
        CommAccountingCallback(ranks_per_host=ranks_per_host),
        EmbarkMetricsCallback(),
    ]
    missing = [new for new in wanted if not any(isinstance(c, type(new)) for c in out)]
    at = next((i for i, c in enumerate(out) if isinstance(c, Checkpoint)), len(out))
    return [*out[:at], *missing, *out[at:]]
