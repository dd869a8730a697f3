"""DelimitedDataModule: columns by name or index, the model spec it implies, per-rank
loaders (train, validation, predict) and errors that name the fix."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_embark.data import (
    CriteoDataModule,
    DelimitedDataModule,
    DelimitedDataset,
    DelimitedFormat,
)
from lightning_embark.errors import ConfigError, DataFormatError

HEADER = "clicked,price,age,site,device,city\n"


def _clicks(path: Path, lines: int, *, header: bool = True) -> Path:
    """A CSV: label, two numbers, three text categories (some empty), one line each."""
    rows = [
        f"{i % 2},{i * 1.5},{20 + i % 50},site-{i % 7},{('ios', 'web', '')[i % 3]},c {i % 5}\n"
        for i in range(lines)
    ]
    path.write_text((HEADER if header else "") + "".join(rows))
    return path


def _module(path: Path, **options) -> DelimitedDataModule:
    options = {"header": True, "label": "clicked", "num_embeddings": 50} | options
    return DelimitedDataModule(str(path), **options)


def test_categorical_defaults_to_every_other_column_and_sizes_the_model(
    tmp_path: Path, as_rows
) -> None:
    path = _clicks(tmp_path / "clicks.csv", 40)
    module = _module(
        path, dense=["price", "age"], num_embeddings={"site": 7, "device": 3, "city": 5}
    )
    assert module.feature_names == ["site", "device", "city"]
    assert module.num_dense_features == 2
    assert module.table_rows == {"site": 7, "device": 3, "city": 5}
    spec = module.model_spec(embedding_dim=8)
    assert [(t.name, t.num_embeddings, t.embedding_dim) for t in spec.tables] == [
        ("site", 7, 8),
        ("device", 3, 8),
        ("city", 5, 8),
    ]
    assert spec.num_dense_features == 2
    # The same batches as the reader given the format by hand.
    fmt = DelimitedFormat(
        has_header=True,
        label_column="clicked",
        dense_columns=("price", "age"),
        categorical_columns=("site", "device", "city"),
    )
    by_hand = DelimitedDataset(
        path, fmt, num_embeddings=[7, 3, 5], batch_size=8, split="val", drop_last=False
    )
    assert as_rows(list(module.val_dataloader())) == as_rows(list(by_hand))


def test_all_categorical_data_and_columns_by_index(tmp_path: Path) -> None:
    path = _clicks(tmp_path / "clicks.csv", 30, header=False)
    module = DelimitedDataModule(str(path), dense=[], num_embeddings=50, batch_size=4)
    assert module.feature_names == ["C1", "C2", "C3", "C4", "C5"]  # columns 1..5
    assert module.num_dense_features == 0 and module.model_spec().num_dense_features == 0
    picked = DelimitedDataModule(
        str(path), label=0, categorical=[3, 5], num_embeddings=50, batch_size=4
    )
    assert picked.feature_names == ["C1", "C2"]
    batch = next(iter(picked.train_dataloader()))
    assert tuple(batch.dense_features.shape) == (4, 0)
    assert batch.sparse_features.keys() == ["C1", "C2"]


def test_ranks_split_global_batches_and_predict_keeps_every_line_in_order(
    tmp_path: Path, as_rows
) -> None:
    """3 ranks x 4 against one process x 12, for train; predict reads all 50 lines (the
    last global batch of 2 split over the ranks, some empty) in file order."""
    path = _clicks(tmp_path / "clicks.csv", 50)
    world = 3

    def loaders(batch_size: int, rank: int, world_size: int) -> DelimitedDataModule:
        module = _module(path, dense=["price"], batch_size=batch_size)
        module.trainer = SimpleNamespace(global_rank=rank, world_size=world_size)
        return module

    single = list(loaders(12, 0, 1).train_dataloader())
    ranks = [list(loaders(4, r, world).train_dataloader()) for r in range(world)]
    assert len({len(batches) for batches in ranks}) == 1 and len(ranks[0]) == len(single)
    for step, batch in enumerate(single):
        assert as_rows([ranks[r][step] for r in range(world)]) == as_rows([batch])

    predicted = [list(loaders(4, r, world).predict_dataloader()) for r in range(world)]
    assert len({len(batches) for batches in predicted}) == 1
    in_order = [predicted[r][b] for b in range(len(predicted[0])) for r in range(world)]
    every_line = DelimitedDataset(
        path,
        loaders(4, 0, 1).fmt,
        num_embeddings=50,
        batch_size=50,
        split="all",
        drop_last=False,
    )
    assert as_rows(in_order) == as_rows(list(every_line))
    assert [row[1] for row in as_rows(in_order)] == [float(i % 2) for i in range(50)]


def test_predict_path_reads_another_file_of_the_same_layout(tmp_path: Path, as_rows) -> None:
    train = _clicks(tmp_path / "train.csv", 40)
    new = _clicks(tmp_path / "new.csv", 9)
    module = _module(train, predict_path=str(new), batch_size=4)
    labels = [row[1] for row in as_rows(list(module.predict_dataloader()))]
    assert labels == [float(i % 2) for i in range(9)]


def test_criteo_options_read_a_criteo_file_as_criteo_data_module_does(
    shared_file, as_rows
) -> None:
    path = shared_file("criteo-autorec-train-10k.txt")
    generic = DelimitedDataModule(
        str(path),
        delimiter="\t",
        dense=list(range(1, 14)),
        categorical_encoding="hex32",
        quoting=False,
        num_embeddings=1000,
        batch_size=64,
    )
    criteo = CriteoDataModule(str(path), num_embeddings=1000, batch_size=64)
    assert generic.feature_names == criteo.feature_names == [f"C{i}" for i in range(1, 27)]
    assert generic.model_spec().tables == criteo.model_spec().tables
    first = [next(iter(m.train_dataloader())) for m in (generic, criteo)]
    assert as_rows(first[:1]) == as_rows(first[1:])


def test_bad_options_are_errors_that_name_the_fix(tmp_path: Path) -> None:
    path = _clicks(tmp_path / "clicks.csv", 10)
    with pytest.raises(
        DataFormatError, match=r"1 field\(s\) separated by '\\t'.*--data\.delimiter"
    ):
        DelimitedDataModule(str(path), delimiter="\t", dense=[1, 2])
    with pytest.raises(DataFormatError, match=r"no column 'clicks'.*'clicked'"):
        _module(path, label="clicks")
    with pytest.raises(ConfigError, match="has_header=False"):
        DelimitedDataModule(str(path), label="clicked")
    with pytest.raises(ConfigError, match="dense must be a list"):
        _module(path, dense="price")
    with pytest.raises(ConfigError, match=r"missing \['city'\]"):
        _module(path, dense=["price", "age"], num_embeddings={"site": 7, "device": 3})
    with pytest.raises(ConfigError, match=r"does not exist.*--data\.predict_path"):
        _module(path, predict_path=str(tmp_path / "absent.csv"))
    with pytest.raises(ConfigError, match=r"does not exist.*--data\.path"):
        DelimitedDataModule(str(tmp_path / "absent.csv"))
    with pytest.raises(ConfigError, match="unknown text encoding"):
        _module(path, encoding="no-such-codec")
