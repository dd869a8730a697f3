"""Lightning callback that counts one training step's dispatches (:class:`DispatchCounter`)."""

from __future__ import annotations

import contextlib
from typing import Any

import lightning.pytorch as pl

from lightning_embark.accounting._dispatch import DispatchCounter, DispatchSnapshot
from lightning_embark.accounting._dispatch_scopes import scope_clusters, scope_sharded_modules


class DispatchCountCallback(pl.Callback):
    """Counts the ATen ops, would-be host syncs and collective ops of training step ``step``.

    The count runs from the end of the step before (so the batch fetch inside it, which
    queues the next batch's input distribution when the strategy pipelines, is in) to the
    end of ``step``; work the step queued to the engine's threads counts with it whenever
    it runs (the backward's updates left on the lane, the next batch's distribution).
    :attr:`snapshot` holds the result once training ends, when that work has run. Engine
    clusters and torchrec's sharded modules are scoped (:mod:`._dispatch_scopes`).

    The counted step runs slower (a Python call per op), and so does the work it queues,
    which runs into the next step: count a warm-up step at least two before the measured
    ones.

    Args:
        step: The training step (0-based) to count.
    """

    def __init__(self, *, step: int) -> None:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self.step = step
        self.counter = DispatchCounter()
        self.snapshot: DispatchSnapshot | None = None
        self._stack = contextlib.ExitStack()
        self._seen = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root = trainer.strategy.model or pl_module
        scope_clusters(root)
        scope_sharded_modules(root)
        if self.step == 0:
            self._stack.enter_context(self.counter.counting())

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._seen == self.step:
            self._stack.close()
        elif self._seen == self.step - 1:
            self._stack.enter_context(self.counter.counting())
        self._seen += 1

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stack.close()
        if self._seen > self.step:
            self.snapshot = self.counter.snapshot()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stack.close()
