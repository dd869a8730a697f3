"""One model trained on one dataset with one seed, and its validation AUC.

The model is :class:`~lightning_embark.models.DLRMModule` (torchrec's DLRM, dot
interaction; with a towers file, the same DLRM over torchrec's
``EmbeddingTowerCollection``), trained by a quiet Lightning ``Trainer`` on one process:
the towered model trains on any cluster exactly as it does alone (the engine's towers are
tested equal to the unsharded model, forward, gradients and optimizer steps), so the AUC
measured here is the model's, not a sharding's.

Pairing: within a seed every variant sees the same batches in the same order (the
shuffle's generator is the seed's), and every table starts from the same values (drawn
from a generator of the seed and the table's name, whichever collection holds it), so the
difference between two variants of one seed is their architecture's, plus the training
noise of their different MLPs.
"""

from __future__ import annotations

import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from _towers_quality.datasets import Loaded
from lightning_embark.models import DLRMModule
from lightning_embark.plan import TowerRequest, save_towers
from lightning_embark.planner import FeatureAffinity, measure_affinity
from lightning_embark.testing import quiet_trainer

#: The MLPs: no dense features, so the bottom MLP maps a constant to one vector.
DENSE_ARCH = (16,)
OVER_ARCH = (64, 32, 1)
#: Batches the warm-up affinity averages its moments over.
AFFINITY_BATCHES = 8


@dataclass(frozen=True, kw_only=True)
class Trained:
    """What one run gives: its AUC, its training time and, when asked, the warm-up affinity."""

    auc: float
    seconds: float
    affinity: FeatureAffinity | None = None


class _WarmUp(Callback):
    """Measures the flat model's feature affinity once, after ``steps`` steps (the short
    warm-up run ``embark-towers`` makes), on the training batches."""

    def __init__(self, steps: int, batches: Sequence[Batch]) -> None:
        self.steps, self.batches = steps, list(batches)
        self.affinity: FeatureAffinity | None = None

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if self.affinity is None and trainer.global_step >= self.steps:
            self.affinity = measure_affinity(
                module.model, self.batches, max_batches=AFFINITY_BATCHES, source="warm-up"
            )


def paired_init(model: DLRMModule, seed: int, scale: float | None) -> None:
    """Every table uniform in ``+-scale`` (None: torchrec's ``+-1/sqrt(rows)``) from a
    generator of ``(seed, table name)``: flat and towered models start alike."""
    collections: list[EmbeddingBagCollection] = []
    for module in model.embedding_modules().values():
        if isinstance(module, EmbeddingTowerCollection):
            collections += [t.embedding for t in module.towers]
        else:
            collections.append(module)
    for collection in collections:
        configs = collection.embedding_bag_configs()
        for config, bag in zip(configs, collection.embedding_bags.values(), strict=True):
            generator = torch.Generator().manual_seed(
                seed * 1_000_003 + zlib.crc32(config.name.encode())
            )
            bound = scale if scale is not None else config.num_embeddings**-0.5
            weight = bag.weight
            with torch.no_grad():
                weight.copy_((torch.rand(weight.shape, generator=generator) * 2 - 1) * bound)


def train(
    data: Loaded,
    seed: int,
    towers: Sequence[TowerRequest] | None,
    *,
    warmup_steps: int | None = None,
    max_steps: int | None = None,
) -> Trained:
    """Train one model (``towers``: None for flat) and score it on the validation split.

    Args:
        data: The dataset and its recipe.
        seed: Seeds the MLPs, the tables' start and the batch order.
        towers: The towers, or None for the flat model.
        warmup_steps: Measure the flat model's affinity after this many steps.
        max_steps: Stop after this many steps (None: the recipe's epochs).
    """
    recipe = data.recipe
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="towers-quality-") as tmp:
        path = None
        if towers is not None:
            path = str(Path(tmp) / "towers.json")
            save_towers(towers, path)
        model = DLRMModule(
            data.spec,
            interaction="dot",
            dense_arch_layer_sizes=list(DENSE_ARCH),
            over_arch_layer_sizes=list(OVER_ARCH),
            dense_optimizer="adagrad",
            dense_lr=recipe.dense_lr,
            sparse_optimizer="rowwise_adagrad",
            sparse_lr=recipe.sparse_lr,
            towers=path,
        )
    model.materialize_embeddings()
    paired_init(model, seed, recipe.init_scale)
    callbacks = [] if warmup_steps is None else [_WarmUp(warmup_steps, data.train)]
    trainer = quiet_trainer(
        max_epochs=recipe.epochs,
        max_steps=max_steps or -1,
        limit_val_batches=0,
        callbacks=callbacks,
    )
    order = torch.Generator().manual_seed(seed)
    loader = DataLoader(data.train, batch_size=None, shuffle=True, generator=order)
    start = time.perf_counter()
    trainer.fit(model, loader)
    seconds = time.perf_counter() - start
    affinity = callbacks[0].affinity if callbacks else None
    return Trained(auc=auc(model, data.val), seconds=seconds, affinity=affinity)


@torch.no_grad()
def auc(model: DLRMModule, batches: Sequence[Batch]) -> float:
    """Validation AUC over every row of ``batches``, computed once."""
    model.eval()
    logits = torch.cat([model(b.dense_features, b.sparse_features) for b in batches])
    labels = torch.cat([b.labels for b in batches]).int()
    return float(binary_auroc(torch.sigmoid(logits), labels))
