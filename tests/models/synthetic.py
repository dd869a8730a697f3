"""Learnable synthetic DLRM batches for tests (the data package is written elsewhere).

Labels come from a hidden logistic model over the dense features and a hidden score
per embedding row, so a DLRM can lower its loss on them within a few steps. Loaded
by path from the conftest files and the multi-process scripts (tests have no
packages under ``--import-mode=importlib``).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.spec import ModelSpec, TableSpec


def tiny_spec(
    *, num_tables: int = 4, rows: int = 200, dim: int = 16, num_dense: int = 8
) -> ModelSpec:
    """A few small tables of equal width, hotness 2."""
    tables = tuple(
        TableSpec(
            name=f"f{i}", num_embeddings=rows + 10 * i, embedding_dim=dim, pooling_factor=2.0
        )
        for i in range(num_tables)
    )
    return ModelSpec(name="tiny", tables=tables, num_dense_features=num_dense)


def random_kjt(spec: ModelSpec, batch_size: int, generator: torch.Generator) -> KeyedJaggedTensor:
    """IDs uniform over each table's rows, 0..2*hotness IDs per sample."""
    lengths, values = [], []
    for table in spec.tables:
        hot = max(1, round(table.pooling_factor))
        table_lengths = torch.randint(0, 2 * hot + 1, (batch_size,), generator=generator)
        lengths.append(table_lengths)
        values.append(
            torch.randint(
                0, table.num_embeddings, (int(table_lengths.sum()),), generator=generator
            )
        )
    return KeyedJaggedTensor.from_lengths_sync(
        keys=spec.feature_names, values=torch.cat(values), lengths=torch.cat(lengths)
    )


def synthetic_batches(
    spec: ModelSpec, *, num_batches: int, batch_size: int, seed: int = 0, model_seed: int = 1234
) -> list[Batch]:
    """``num_batches`` batches whose labels a DLRM can learn.

    ``model_seed`` fixes the hidden labelling model, ``seed`` the samples: batches
    drawn with different seeds and the same model seed are a train/validation split.
    """
    hidden = torch.Generator().manual_seed(model_seed)
    dense_weight = torch.randn(spec.num_dense_features, generator=hidden)
    row_scores = [torch.randn(t.num_embeddings, generator=hidden) for t in spec.tables]
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        dense = torch.randn(batch_size, spec.num_dense_features, generator=generator)
        kjt = random_kjt(spec, batch_size, generator)
        logit = dense @ dense_weight
        for scores, jagged in zip(row_scores, kjt.to_dict().values(), strict=False):
            sums = torch.zeros(batch_size).index_add_(
                0,
                torch.repeat_interleave(torch.arange(batch_size), jagged.lengths()),
                scores[jagged.values()],
            )
            logit = logit + sums
        labels = (logit > 0).float()
        batches.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))
    return batches


class BatchDataset(Dataset):
    """Pre-built batches; use with ``DataLoader(..., batch_size=None)``."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return self.batches[index]
