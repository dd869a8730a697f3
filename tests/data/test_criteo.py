"""CriteoDataset on the real 10k-line Criteo DAC sample, and criteo_spec."""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.data import CRITEO_FORMAT, CriteoDataset, criteo_spec
from lightning_embark.errors import ConfigError
from lightning_embark.spec import load_spec

SAMPLE = "criteo-autorec-train-10k.txt"
ROWS = 1000


@pytest.fixture
def criteo(shared_file) -> Path:
    return shared_file(SAMPLE)


def _load(path: Path, **kwargs) -> list[Batch]:
    kwargs.setdefault("num_embeddings", ROWS)
    return list(CriteoDataset(path, **kwargs))


def test_all_split_reads_every_line_with_known_label_count(criteo: Path) -> None:
    start = time.perf_counter()
    batches = _load(criteo, batch_size=512, split="all", drop_last=False)
    elapsed = time.perf_counter() - start
    assert sum(len(b.labels) for b in batches) == 10_000
    assert int(sum(b.labels.sum().item() for b in batches)) == 2_182
    assert elapsed < 3.0, f"parsing 10k Criteo lines took {elapsed:.2f} s"
    full = _load(criteo, batch_size=512, split="all")
    assert len(full) == 10_000 // 512  # the incomplete final global batch is dropped


def test_batches_follow_torchrec_layout(criteo: Path) -> None:
    batch = next(
        iter(
            DataLoader(
                CriteoDataset(criteo, num_embeddings=ROWS, batch_size=64, split="all"),
                batch_size=None,
            )
        )
    )
    assert isinstance(batch, Batch)
    assert batch.dense_features.shape == (64, 13)
    assert batch.dense_features.dtype == torch.float32
    assert batch.labels.shape == (64,) and batch.labels.dtype == torch.float32
    assert batch.sparse_features.keys() == [f"C{i}" for i in range(1, 27)]
    assert batch.sparse_features.stride() == 64


def test_first_line_parsed_exactly(criteo: Path) -> None:
    fields = criteo.open().readline().rstrip("\n").split("\t")
    batch = _load(criteo, batch_size=8, split="all", num_embeddings=ROWS)[0]
    expected_dense = [math.log1p(max(float(v), 0.0)) if v else 0.0 for v in fields[1:14]]
    assert batch.labels[0].item() == float(fields[0])
    assert batch.dense_features[0].tolist() == pytest.approx(expected_dense, rel=1e-6)
    features = batch.sparse_features.to_dict()
    for i, value in enumerate(fields[14:]):
        ids = features[f"C{i + 1}"].to_dense()[0].tolist()
        assert ids == ([int(value, 16) % ROWS] if value else [])


def test_empty_categorical_fields_become_empty_bags(criteo: Path) -> None:
    lines = [
        line.rstrip("\n").split("\t") for line, _ in zip(criteo.open(), range(512), strict=False)
    ]
    batch = _load(criteo, batch_size=512, split="all")[0]
    features = batch.sparse_features.to_dict()
    empty = 0
    for i in range(26):
        lengths = features[f"C{i + 1}"].lengths().tolist()
        expected = [0 if line[14 + i] == "" else 1 for line in lines]
        assert lengths == expected
        empty += expected.count(0)
    assert empty > 0, "the sample is expected to contain missing categorical values"


def test_values_in_range_and_dense_log_transformed(criteo: Path) -> None:
    sizes = [10 + 7 * i for i in range(26)]
    for batch in _load(criteo, batch_size=1000, split="all", num_embeddings=sizes):
        assert torch.isfinite(batch.dense_features).all()
        assert (batch.dense_features >= 0).all()
        assert batch.dense_features.max() < 25  # log1p scale, not raw counts
        for size, jagged in zip(sizes, batch.sparse_features.to_dict().values(), strict=False):
            values = jagged.values()
            assert values.dtype == torch.int64
            assert ((values >= 0) & (values < size)).all()


def test_train_and_val_partition_the_file(criteo: Path, as_rows) -> None:
    every = Counter(as_rows(_load(criteo, batch_size=100, split="all", drop_last=False)))
    train = as_rows(_load(criteo, batch_size=100, split="train", drop_last=False))
    val = as_rows(_load(criteo, batch_size=100, split="val", drop_last=False))
    assert len(train) + len(val) == 10_000
    assert 0.18 < len(val) / 10_000 < 0.22
    assert Counter(train) + Counter(val) == every
    again = as_rows(_load(criteo, batch_size=100, split="val", drop_last=False))
    assert again == val
    other_seed = as_rows(_load(criteo, batch_size=100, split="val", drop_last=False, seed=1))
    assert other_seed != val


@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_concatenate_to_the_single_rank_stream(criteo: Path, as_rows, drop_last) -> None:
    single = _load(criteo, batch_size=1024, split="train", drop_last=drop_last)
    ranks = [
        _load(criteo, batch_size=512, split="train", drop_last=drop_last, rank=r, world_size=2)
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for index, whole in enumerate(single):
        assert as_rows([ranks[0][index], ranks[1][index]]) == as_rows([whole])


def test_accepts_a_spec_for_table_sizes(criteo: Path) -> None:
    spec = load_spec("mlperf-dlrm-dcnv2", max_rows=500)
    batch = _load(criteo, batch_size=256, split="all", num_embeddings=spec)[0]
    for table, jagged in zip(spec.tables, batch.sparse_features.to_dict().values(), strict=False):
        assert int(jagged.values().max()) < table.num_embeddings


def test_criteo_spec_matches_format_and_preset_names() -> None:
    spec = criteo_spec(num_embeddings=1000, embedding_dim=8)
    assert spec.feature_names == list(CRITEO_FORMAT.feature_names)
    assert spec.feature_names == load_spec("mlperf-dlrm-dcnv2").feature_names
    assert spec.num_dense_features == 13
    assert all(t.pooling_factor == 1 and t.embedding_dim == 8 for t in spec.tables)
    sized = criteo_spec(list(range(1, 27)))
    assert [t.num_embeddings for t in sized.tables] == list(range(1, 27))
    assert len(spec.embedding_bag_configs()) == 26


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_embeddings": [10] * 25}, "26 features"),
        ({"num_embeddings": 0}, "positive integer"),
        ({"embedding_dim": 0}, "embedding_dim"),
    ],
)
def test_criteo_spec_rejects_bad_sizes(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        criteo_spec(**kwargs)


def test_batches_feed_a_torchrec_embedding_bag_collection(criteo: Path) -> None:
    spec = criteo_spec(num_embeddings=ROWS, embedding_dim=4)
    collection = EmbeddingBagCollection(tables=spec.embedding_bag_configs())
    batch = _load(criteo, batch_size=32, split="val")[0]
    pooled = collection(batch.sparse_features)
    assert pooled.values().shape == (32, 26 * 4)


def test_criteo_missing_value_options_reach_the_format(tmp_path: Path) -> None:
    fields = ["1", "", *("1" for _ in range(12)), "", *("0000000a" for _ in range(25))]
    path = tmp_path / "day_0.txt"
    path.write_text("\t".join(fields) + "\n")
    (default,) = _load(path, batch_size=1, split="all", drop_last=False)
    assert default.dense_features[0, 0].item() == 0.0
    assert default.sparse_features["C1"].lengths().tolist() == [0]
    (chosen,) = _load(
        path,
        batch_size=1,
        split="all",
        drop_last=False,
        missing_dense=math.e - 1,
        missing_categorical="id:3",
    )
    assert chosen.dense_features[0, 0].item() == pytest.approx(1.0)  # log1p(e - 1)
    assert chosen.sparse_features["C1"].values().tolist() == [3]
    with pytest.raises(ConfigError, match="missing_categorical"):
        CriteoDataset(path, batch_size=1, missing_categorical="id:zz")
