"""A LightningDataModule over a Criteo DAC file: deterministic train/validation split, per-rank
shards.

The module knows nothing about the strategy: at ``setup`` it asks the Trainer for this
rank and the world size and hands them to :class:`~lightning_embark.data.CriteoDataset`,
whose sharding rule makes the ranks' b-th batches, concatenated in rank order, the
b-th global batch. So the same module serves single-process training (one rank, global
batches of ``batch_size``), ``ddp``, ``torchrec`` and ``embark``, and N ranks with
``batch_size`` B see exactly the global batches one process with ``batch_size`` N x B sees.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from lightning_embark.data._criteo import CRITEO_FORMAT, DEFAULT_NUM_EMBEDDINGS, CriteoDataset
from lightning_embark.data._delimited import DEFAULT_MAX_SKIP_FRACTION
from lightning_embark.errors import ConfigError


class CriteoDataModule(LightningDataModule):
    """Train and validation loaders over one Criteo file, sharded over the Trainer's ranks.

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

    Validation keeps every line: its last global batch is split over the ranks like
    the others (some ranks may get an empty batch), so metrics cover the whole split.
    """

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
    ) -> None:
        super().__init__()
        if not Path(path).is_file():
            raise ConfigError(
                f"Criteo file {str(path)!r} does not exist or is not a file; pass --data.path PATH"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(
                f"batch_size must be a positive integer (examples per rank), got {batch_size!r}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        self.path = str(path)
        self.batch_size = batch_size
        self.num_embeddings = num_embeddings
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.drop_last_train = drop_last_train
        self.on_error = on_error
        self.max_skip_fraction = max_skip_fraction
        self.num_workers = num_workers
        self.missing_dense = missing_dense
        self.missing_categorical = missing_categorical
        self.save_hyperparameters()
        # Validates the remaining options now rather than at the first dataloader.
        self.dataset("train", rank=0, world_size=1)

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def dataset(
        self, split: str, *, rank: int | None = None, world_size: int | None = None
    ) -> CriteoDataset:
        """One split as seen by ``rank`` of ``world_size`` (default: the Trainer's rank and
        world)."""
        if rank is None or world_size is None:
            rank, world_size = self._rank_and_world()
        return CriteoDataset(
            self.path,
            num_embeddings=self.num_embeddings,
            batch_size=self.batch_size,
            split=split,
            val_fraction=self.val_fraction,
            seed=self.split_seed,
            rank=rank,
            world_size=world_size,
            drop_last=self.drop_last_train if split == "train" else False,
            on_error=self.on_error,
            max_skip_fraction=self.max_skip_fraction,
            missing_dense=self.missing_dense,
            missing_categorical=self.missing_categorical,
        )

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.dataset(split),
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        """This rank's training batches (``batch_size`` examples each)."""
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        """This rank's validation batches; every validation line is in some rank's batch."""
        return self._loader("val")
