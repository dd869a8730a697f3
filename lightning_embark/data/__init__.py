"""Data for training and benchmarks, as torchrec ``Batch`` streams.

Every dataset is an ``IterableDataset`` yielding whole per-rank batches (use
``DataLoader(dataset, batch_size=None)``); ``batch_size`` is always per rank. The
stream is cut into global batches of ``batch_size * world_size`` consecutive
examples and rank ``r`` takes rows ``[r * batch_size, (r + 1) * batch_size)`` of each.

- :class:`DelimitedDataset` / :class:`DelimitedFormat`: any CSV/TSV CTR file;
  :func:`libfm_format` for positional libFM files (``label index:1 ...``).
- :class:`DelimitedDataModule`: a LightningDataModule over such a file, named by its
  columns, with train/val/predict loaders and the model spec it implies
  (:meth:`~DelimitedDataModule.model_spec`, or :func:`ctr_spec` from table rows).
- :class:`CriteoDataset` / :data:`CRITEO_FORMAT` / :func:`criteo_spec` /
  :class:`CriteoDataModule`: Criteo DAC files.
- :class:`MovieLensDataset`: MovieLens-1M ratings joined with its user and movie
  tables (eight features, genres multi-hot; a rating >= 4 is a click).
- :class:`SyntheticDataset`: spec-shaped data with a learnable hidden teacher.
- :class:`InteractionDataset`: clicks that depend only on pairs inside known groups of
  features (the ground truth of the tower partitioner's tests).
"""

from lightning_embark.data._criteo import (
    CRITEO_FORMAT,
    DEFAULT_NUM_EMBEDDINGS,
    CriteoDataset,
    criteo_spec,
)
from lightning_embark.data._datamodule import CriteoDataModule
from lightning_embark.data._delimited import DelimitedDataset, DelimitedFormat
from lightning_embark.data._delimited_module import DelimitedDataModule
from lightning_embark.data._format import libfm_format
from lightning_embark.data._interactions import InteractionDataset
from lightning_embark.data._movielens import MOVIELENS_FEATURES, MovieLensDataset
from lightning_embark.data._spec import DEFAULT_EMBEDDING_DIM, ctr_spec
from lightning_embark.data._synthetic import SyntheticDataset

__all__ = [
    "CRITEO_FORMAT",
    "DEFAULT_EMBEDDING_DIM",
    "DEFAULT_NUM_EMBEDDINGS",
    "MOVIELENS_FEATURES",
    "CriteoDataModule",
    "CriteoDataset",
    "DelimitedDataModule",
    "DelimitedDataset",
    "DelimitedFormat",
    "InteractionDataset",
    "MovieLensDataset",
    "SyntheticDataset",
    "criteo_spec",
    "ctr_spec",
    "libfm_format",
]
