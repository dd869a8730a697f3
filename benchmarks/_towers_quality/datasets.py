"""Frappe and MovieLens-1M as in-memory batches, split 80/20, with the recipe each trains by.

Both are read through the data package (:func:`~lightning_embark.data.libfm_format` for
Frappe's libFM files, :class:`~lightning_embark.data.MovieLensDataset` for the ML-1M
join) and split by its stable hash of the line index (split seed 0): a fixed split that
every seed and every variant shares, so that the seeds vary only the training. Neither
dataset has an order to respect (no time in Frappe's files; ML-1M's timestamps would
allow a temporal split, but a sample of 100,000 ratings over 6,040 users leaves most
users a handful of ratings, too few to hold later ones out), so the hash split stands.

The recipe per dataset (batch, epochs, learning rates, the tables' starting scale) was
chosen on the flat model alone, then fixed for every variant:

* **Frappe**: 2 epochs at batch 512, row-wise Adagrad 0.2 on the tables, Adagrad 0.1 on
  the MLPs, tables uniform in +-0.2. torchrec's default start, +-1/sqrt(rows), is +-0.014
  for Frappe's 5,382-row tables (its libFM indices are global), which leaves the dot
  interaction at its saddle near zero for a seed-dependent number of steps: flat's AUC
  then spread over 0.939-0.954 across four seeds, against 0.956-0.958 from +-0.2.
* **MovieLens-1M**: 2 epochs at batch 256, row-wise Adagrad 0.01, Adagrad 0.02, torchrec's
  default start (later epochs overfit: 80,000 ratings over 6,040 users and 3,883 movies).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchrec.datasets.utils import Batch

from lightning_embark.data import DelimitedDataset, MovieLensDataset, ctr_spec, libfm_format
from lightning_embark.spec import ModelSpec

FRAPPE_FILES = ("frappe-nfm-validation.libfm", "frappe-nfm-test.libfm")
#: Frappe's ten one-hot fields, in the files' order (the dataset's readme).
FRAPPE_FIELDS = (
    "user",
    "item",
    "daytime",
    "weekday",
    "isweekend",
    "homework",
    "cost",
    "weather",
    "country",
    "city",
)
#: Frappe's libFM indices are global over its fields: 5,382 features in all (its readme).
FRAPPE_ROWS = 5382
MOVIELENS_FILES = (
    "movielens-librec-ml-1m-ratings-100k.dat",
    "movielens-srimatta-ml-1m-users.dat",
    "movielens-srimatta-ml-1m-movies.dat",
)
DATASETS = ("frappe", "movielens")
VAL_FRACTION = 0.2
SPLIT_SEED = 0
EMBEDDING_DIM = 16


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How one dataset's models train (the same for flat and every towered variant).

    Attributes:
        batch_size: Examples per step.
        epochs: Passes over the training split.
        sparse_lr: Row-wise Adagrad's rate on the tables.
        dense_lr: Adagrad's rate on the MLPs and tower modules.
        init_scale: Tables start uniform in ``+-init_scale``; None: torchrec's
            ``+-1/sqrt(rows)``.
    """

    batch_size: int
    epochs: int
    sparse_lr: float
    dense_lr: float
    init_scale: float | None


RECIPES = {
    "frappe": Recipe(batch_size=512, epochs=2, sparse_lr=0.2, dense_lr=0.1, init_scale=0.2),
    "movielens": Recipe(batch_size=256, epochs=2, sparse_lr=0.01, dense_lr=0.02, init_scale=None),
}


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """One dataset: its spec, its splits as batches, and its recipe."""

    name: str
    spec: ModelSpec
    train: list[Batch]
    val: list[Batch]
    recipe: Recipe

    @property
    def rows(self) -> tuple[int, int]:
        """Training and validation examples."""
        return sum(len(b.labels) for b in self.train), sum(len(b.labels) for b in self.val)


def missing(name: str, data_dir: Path) -> list[Path]:
    """The files of dataset ``name`` absent from ``data_dir``."""
    files = FRAPPE_FILES if name == "frappe" else MOVIELENS_FILES
    return [data_dir / f for f in files if not (data_dir / f).is_file()]


def load(name: str, data_dir: Path) -> Loaded:
    """Dataset ``name`` (``frappe`` or ``movielens``) from ``data_dir``, split 80/20."""
    recipe = RECIPES[name]
    batch = recipe.batch_size
    splits: dict[str, list[Batch]] = {"train": [], "val": []}
    if name == "frappe":
        fmt = libfm_format(FRAPPE_FIELDS)
        spec = ctr_spec(
            dict.fromkeys(FRAPPE_FIELDS, FRAPPE_ROWS),
            num_dense_features=0,
            embedding_dim=EMBEDDING_DIM,
            name="frappe",
        )
        for split, out in splits.items():
            for file in FRAPPE_FILES:
                out += DelimitedDataset(
                    data_dir / file,
                    fmt,
                    num_embeddings=spec,
                    batch_size=batch,
                    split=split,
                    val_fraction=VAL_FRACTION,
                    seed=SPLIT_SEED,
                    drop_last=False,
                )
    else:
        paths = [data_dir / f for f in MOVIELENS_FILES]
        for split, out in splits.items():
            data = MovieLensDataset(
                *paths,
                batch_size=batch,
                split=split,
                val_fraction=VAL_FRACTION,
                seed=SPLIT_SEED,
                drop_last=False,
            )
            out += data
            if split == "train":  # genres' pooling factor: its mean bag over training
                spec = data.model_spec(EMBEDDING_DIM)
    return Loaded(name=name, spec=spec, train=splits["train"], val=splits["val"], recipe=recipe)
