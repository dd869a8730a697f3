"""The sparse features of the trainer's first training batch, for the automatic plan's
statistics (pooling factors, unique ratios) at strategy setup."""

from __future__ import annotations

import logging

from lightning.pytorch import Trainer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.errors import DataFormatError
from lightning_embark.sharding import find_sparse_features

log = logging.getLogger(__name__)


def first_sparse_batch(trainer: Trainer) -> KeyedJaggedTensor | None:
    """The sparse features of the first training batch, or None when none is at hand.

    At strategy setup the fit loop has not loaded its dataloader yet, so this asks the
    trainer's data source (a private but stable Lightning attribute) for a fresh one;
    statistics are an optimisation, so any failure falls back to the spec's numbers.
    A malformed data file falls back silently: the training loop reads the same lines
    on every rank and raises that DataFormatError itself, once (raised here, on rank 0
    alone, it would leave the other ranks waiting for the plan).
    """
    source = getattr(trainer.fit_loop, "_data_source", None)
    try:
        if source is None or not source.is_defined():
            return None
        return find_sparse_features(next(iter(source.dataloader())))
    except DataFormatError:
        return None
    except Exception as error:
        log.warning(
            "could not sample a training batch for plan statistics (%s); using the spec's", error
        )
        return None
