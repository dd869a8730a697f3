"""A LightningDataModule over a Criteo DAC file: deterministic train/validation split, per-rank
shards (the Criteo preset of :class:`~lightning_embark.data._ctr_module.CTRDataModule`).
"""

from __future__ import annotations

import dataclasses

from lightning_embark.data._criteo import CRITEO_FORMAT, DEFAULT_NUM_EMBEDDINGS
from lightning_embark.data._ctr_module import CTRDataModule
from lightning_embark.data._delimited import DEFAULT_MAX_SKIP_FRACTION


class CriteoDataModule(CTRDataModule):
    """Train, validation and predict loaders over one Criteo file, sharded over the
    Trainer's ranks.

    Args:
        path: A tab-separated Criteo DAC / 1TB file (``label, I1..I13, C1..C26``).
        batch_size: Examples per rank per step (the global batch is this times the
            world size).
        num_embeddings: Hashed rows per table (C1..C26); must match the model's tables.
        val_fraction: Share of the lines in the validation split (by a stable hash of
            the line index, so the split does not depend on ranks or batch size).
        split_seed: Seed of that split.
        drop_last_train: Drop the incomplete last global training batch (default), so
            every step has the same global batch size.
        on_error: ``"raise"`` at the first malformed line, or ``"skip"`` such lines.
        max_skip_fraction: With ``on_error="skip"``, the largest share of the file's
            lines a pass may skip; more, or every line, raises a DataFormatError.
        num_workers: DataLoader worker processes per rank (0: parse in the rank).
        missing_dense: What an empty dense field reads as (default 0.0), or None to
            make such a line malformed.
        missing_categorical: What an empty categorical field gives: ``"empty"``
            (default, an empty bag), ``"error"`` or ``"id:<hex>"``.
        predict_path: The Criteo file ``predict`` reads (every line, in order);
            None: ``path``.

    Validation and prediction keep every line: their last global batch is split over
    the ranks like the others (some ranks may get an empty batch), so metrics and
    predictions cover the whole split.
    """

    file_kind = "Criteo file"

    def __init__(
        self,
        path: str,
        batch_size: int = 128,
        num_embeddings: int = DEFAULT_NUM_EMBEDDINGS,
        val_fraction: float = 0.2,
        split_seed: int = 0,
        drop_last_train: bool = True,
        on_error: str = "raise",
        max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
        num_workers: int = 0,
        missing_dense: float | None = CRITEO_FORMAT.missing_dense,
        missing_categorical: str = CRITEO_FORMAT.missing_categorical,
        predict_path: str | None = None,
    ) -> None:
        super().__init__(
            path,
            dataclasses.replace(
                CRITEO_FORMAT,
                missing_dense=missing_dense,
                missing_categorical=missing_categorical,
            ),
            batch_size=batch_size,
            num_embeddings=num_embeddings,
            val_fraction=val_fraction,
            split_seed=split_seed,
            drop_last_train=drop_last_train,
            on_error=on_error,
            max_skip_fraction=max_skip_fraction,
            num_workers=num_workers,
            predict_path=predict_path,
        )
        self.missing_dense = missing_dense
        self.missing_categorical = missing_categorical
        self.save_hyperparameters()
