"""What every LightningDataModule over a delimited CTR file shares: the train/validation
split, this rank's loaders, and the model inputs the file's format implies.

The module knows nothing about the strategy: each loader asks the Trainer for this
rank and the world size and hands them to :class:`~lightning_embark.data.DelimitedDataset`,
whose sharding rule makes the ranks' b-th batches, concatenated in rank order, the
b-th global batch. So the same module serves single-process training (one rank, global
batches of ``batch_size``), ``ddp``, ``torchrec`` and ``embark``, and N ranks with
``batch_size`` B see exactly the global batches one process with ``batch_size`` N x B sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from lightning_embark.data._delimited import DelimitedDataset
from lightning_embark.data._format import DelimitedFormat
from lightning_embark.data._sizes import NumEmbeddings, resolve_num_embeddings
from lightning_embark.data._spec import DEFAULT_EMBEDDING_DIM, ctr_spec
from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec


def check_file(path: str | None, kind: str, option: str) -> None:
    """Refuse a ``path`` (unless None) that is not a file, naming the ``option`` to fix."""
    if path is not None and not Path(path).is_file():
        raise ConfigError(
            f"{kind} {str(path)!r} does not exist or is not a file; pass {option} PATH"
        )


class CTRDataModule(LightningDataModule):
    """Train, validation and predict loaders over one delimited file, sharded over ranks.

    Subclasses decide the file's :class:`DelimitedFormat` and pass it here with the
    options every such file shares (see :class:`~lightning_embark.data.DelimitedDataModule`
    for their meaning).

    Splits: ``train`` and ``val`` partition ``path`` by a stable hash of the example
    index (so the split depends neither on ranks nor on batch size); ``predict``
    reads every line of ``predict_path`` (default ``path``) in file order. Validation
    and prediction keep every line: their last global batch is split over the ranks
    like the others (some ranks may get an empty batch), so metrics and predictions
    cover the whole split.
    """

    #: What the file is called in errors.
    file_kind: ClassVar[str] = "data file"

    def __init__(
        self,
        path: str,
        fmt: DelimitedFormat,
        *,
        batch_size: int,
        num_embeddings: NumEmbeddings,
        val_fraction: float,
        split_seed: int,
        drop_last_train: bool,
        on_error: str,
        max_skip_fraction: float,
        num_workers: int,
        predict_path: str | None,
    ) -> None:
        super().__init__()
        check_file(path, self.file_kind, "--data.path")
        check_file(predict_path, "predict file", "--data.predict_path")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(
                f"batch_size must be a positive integer (examples per rank), got {batch_size!r}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        self.path = str(path)
        self.fmt = fmt
        self.batch_size = batch_size
        self.num_embeddings = num_embeddings
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.drop_last_train = drop_last_train
        self.on_error = on_error
        self.max_skip_fraction = max_skip_fraction
        self.num_workers = num_workers
        self.predict_path = None if predict_path is None else str(predict_path)
        # Validates the remaining options (and the file's first line) now rather than at
        # the first dataloader.
        self.dataset("train", rank=0, world_size=1)
        if self.predict_path is not None:
            self.dataset("predict", rank=0, world_size=1)

    # --- what the model needs ----------------------------------------------------

    @property
    def feature_names(self) -> list[str]:
        """The categorical features (KeyedJaggedTensor keys and table names), in order."""
        return list(self.fmt.names)

    @property
    def num_dense_features(self) -> int:
        """Dense inputs per example (0 for all-categorical data)."""
        return len(self.fmt.dense_columns)

    @property
    def table_rows(self) -> dict[str, int]:
        """Feature -> rows of its table, in feature order: the reader hashes into these."""
        names = self.feature_names
        return dict(zip(names, resolve_num_embeddings(self.num_embeddings, names), strict=True))

    def model_spec(self, embedding_dim: int = DEFAULT_EMBEDDING_DIM) -> ModelSpec:
        """The spec of a model for this data: one ``embedding_dim``-wide table per
        categorical feature, sized as the reader hashes, and the dense width."""
        return ctr_spec(
            self.table_rows,
            num_dense_features=self.num_dense_features,
            embedding_dim=embedding_dim,
            name=Path(self.path).stem or "ctr",
            source=f"{self.path} ({type(self).__name__})",
        )

    # --- datasets and loaders ----------------------------------------------------

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def dataset(
        self, split: str, *, rank: int | None = None, world_size: int | None = None
    ) -> DelimitedDataset:
        """One split (``"train"``, ``"val"`` or ``"predict"``) as seen by ``rank`` of
        ``world_size`` (default: the Trainer's rank and world)."""
        if rank is None or world_size is None:
            rank, world_size = self._rank_and_world()
        predicting = split == "predict"
        return DelimitedDataset(
            (self.predict_path or self.path) if predicting else self.path,
            self.fmt,
            num_embeddings=self.num_embeddings,
            batch_size=self.batch_size,
            split="all" if predicting else split,
            val_fraction=self.val_fraction,
            seed=self.split_seed,
            rank=rank,
            world_size=world_size,
            drop_last=self.drop_last_train if split == "train" else False,
            on_error=self.on_error,
            max_skip_fraction=self.max_skip_fraction,
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

    def predict_dataloader(self) -> DataLoader:
        """This rank's batches of every line of ``predict_path`` (default ``path``), in file
        order across ranks; every line is in some rank's batch."""
        return self._loader("predict")
