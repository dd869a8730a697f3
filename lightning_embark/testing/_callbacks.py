"""Lightning callbacks that tests use to watch a run from the inside.

They live in the package, not in a test file, because the runs they watch are often
gloo ranks spawned by :func:`~lightning_embark.testing.run_gloo_ranks`: a callback
there must be importable by the spawned process, and one shared class keeps two tests
that compare losses step by step recording them the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, Trainer


class LossRecorder(Callback):
    """Records the training loss of every step, in step order, in :attr:`losses`.

    Each loss is detached and cloned, so that later steps (and the optimizer) cannot
    change what was recorded, and equality checks compare the values the step saw.
    ``training_step`` may return the loss itself or a dict with a ``"loss"`` key (as
    Lightning returns to ``on_train_batch_end``).
    """

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(loss.detach().clone())
