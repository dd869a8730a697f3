"""Fixtures shared by the data tests: the shared sample files and batch comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from torchrec.datasets.utils import Batch

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

Row = tuple[tuple[float, ...], float, tuple[tuple[int, ...], ...]]


def batch_rows(batch: Batch) -> list[Row]:
    """A batch as one hashable tuple per example: (dense, label, IDs per feature)."""
    labels = batch.labels.tolist()
    size = len(labels)
    kjt = batch.sparse_features
    lengths = kjt.lengths().tolist()
    values = kjt.values().tolist()
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    bags = [tuple(values[offsets[j] : offsets[j + 1]]) for j in range(len(lengths))]
    dense = batch.dense_features.tolist()
    num_features = len(kjt.keys())
    return [
        (tuple(dense[i]), labels[i], tuple(bags[f * size + i] for f in range(num_features)))
        for i in range(size)
    ]


def rows_of(batches: Sequence[Batch]) -> list[Row]:
    """All examples of several batches, in order."""
    return [row for batch in batches for row in batch_rows(batch)]


@pytest.fixture
def as_rows() -> Callable[[Sequence[Batch]], list[Row]]:
    """Function turning a list of batches into a list of per-example tuples."""
    return rows_of


@pytest.fixture
def shared_file() -> Callable[[str], Path]:
    """Function giving a file of ../shared/data, skipping the test when it is absent."""

    def locate(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.is_file():
            pytest.skip(f"sample data {path} not present (see ../shared/data/SOURCES.md)")
        return path

    return locate
