"""DelimitedDataset: named columns on real CSV samples, malformed input, sharding edge cases."""

from __future__ import annotations

import csv
import math
import zlib
from pathlib import Path

import pytest
import torch

from lightning_embark.data import DelimitedDataset, DelimitedFormat
from lightning_embark.errors import ConfigError, DataFormatError

CRITEO_CSV = "criteo-deepctr-criteo_sample.txt"
MOVIELENS_CSV = "movielens-deepctr-movielens_sample.txt"
MOVIELENS_DAT = "movielens-autorec-ml-1m-ratings-10k.dat"

CRITEO_BY_NAME = DelimitedFormat(
    delimiter=",",
    has_header=True,
    label_column="label",
    dense_columns=[f"I{i}" for i in range(1, 14)],
    categorical_columns=[f"C{i}" for i in range(1, 27)],
    categorical_encoding="hex32",
)
MOVIELENS_BY_NAME = DelimitedFormat(
    delimiter=",",
    has_header=True,
    label_column="rating",
    categorical_columns=["user_id", "movie_id", "genres", "gender", "age", "occupation", "zip"],
    categorical_encoding="string",
    dense_transform="none",
    label_threshold=4.0,
    multi_value_separator="|",
)


def _all(path: Path, fmt: DelimitedFormat, **kwargs) -> list:
    kwargs.setdefault("num_embeddings", 1000)
    kwargs.setdefault("batch_size", 16)
    kwargs.setdefault("split", "all")
    kwargs.setdefault("drop_last", False)
    return list(DelimitedDataset(path, fmt, **kwargs))


def _write(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_criteo_csv_by_column_names(shared_file) -> None:
    path = shared_file(CRITEO_CSV)
    batches = _all(path, CRITEO_BY_NAME, batch_size=64)
    assert sum(len(b.labels) for b in batches) == 200
    assert int(sum(b.labels.sum().item() for b in batches)) == 49
    assert batches[0].sparse_features.keys() == [f"C{i}" for i in range(1, 27)]
    first = next(csv.DictReader(path.open()))
    expected = [math.log1p(max(float(first[f"I{i}"] or 0), 0.0)) for i in range(1, 14)]
    assert batches[0].dense_features[0].tolist() == pytest.approx(expected, rel=1e-6)
    c1 = batches[0].sparse_features["C1"].to_dense()[0].tolist()
    assert c1 == [int(first["C1"], 16) % 1000]
    c26 = batches[0].sparse_features["C26"].to_dense()[0].tolist()
    assert c26 == ([int(first["C26"], 16) % 1000] if first["C26"] else [])


def test_movielens_csv_by_names_with_multi_value_genres(shared_file) -> None:
    path = shared_file(MOVIELENS_CSV)
    records = list(csv.DictReader(path.open()))
    sizes = {
        "user_id": 500,
        "movie_id": 400,
        "genres": 20,
        "gender": 2,
        "age": 10,
        "occupation": 25,
        "zip": 300,
    }
    batches = _all(path, MOVIELENS_BY_NAME, num_embeddings=sizes, batch_size=50)
    assert sum(len(b.labels) for b in batches) == len(records) == 200
    labels = torch.cat([b.labels for b in batches]).tolist()
    assert labels == [float(int(r["rating"]) >= 4) for r in records]
    assert batches[0].dense_features.shape == (50, 0)
    genres = torch.cat([b.sparse_features["genres"].lengths() for b in batches]).tolist()
    assert genres == [len(r["genres"].split("|")) for r in records]
    assert max(genres) > 1
    first = batches[0].sparse_features
    assert first["user_id"].to_dense()[0].tolist() == [
        zlib.crc32(records[0]["user_id"].encode()) % 500
    ]
    assert first["genres"].to_dense()[0].tolist() == [
        zlib.crc32(g.encode()) % 20 for g in records[0]["genres"].split("|")
    ]


def test_multi_character_delimiter_and_int_ids(shared_file) -> None:
    path = shared_file(MOVIELENS_DAT)
    fmt = DelimitedFormat(
        delimiter="::",
        label_column=2,
        categorical_columns=[0, 1],
        feature_names=["user", "movie"],
        categorical_encoding="int",
        label_threshold=4,
        dense_transform="none",
    )
    batches = _all(path, fmt, num_embeddings={"user": 10_000, "movie": 4_000}, batch_size=2500)
    lines = [line.split("::") for line in path.read_text().splitlines()]
    assert sum(len(b.labels) for b in batches) == len(lines) == 10_000
    users = torch.cat([b.sparse_features["user"].values() for b in batches]).tolist()
    assert users == [int(line[0]) for line in lines]
    positives = sum(int(line[2]) >= 4 for line in lines)
    assert int(sum(b.labels.sum().item() for b in batches)) == positives


def test_missing_fields_quotes_and_default_feature_names(tmp_path: Path) -> None:
    path = _write(tmp_path, 'y,d,c,t\n1,,"a,b",\n0,2.5,,x\n\n1,-3,"q",y\n')
    fmt = DelimitedFormat(
        has_header=True, label_column="y", dense_columns=["d"], categorical_columns=[2, "t"]
    )
    (batch,) = _all(path, fmt, batch_size=8)
    assert batch.sparse_features.keys() == ["C1", "t"]
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]
    assert batch.dense_features[:, 0].tolist() == pytest.approx([0.0, math.log1p(2.5), 0.0])
    assert batch.sparse_features["C1"].lengths().tolist() == [1, 0, 1]
    assert batch.sparse_features["t"].lengths().tolist() == [0, 1, 1]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("1,2,a\n0,3,b\n1,4\n0,5,c\n", 3, "expected 3 fields"),
        ("1,2,a\n0,3,b\n1,4,c\n0,x5,d\n", 4, "cannot parse 'x5'"),
        ("1,2,a\n2,3,b\n", 2, "not in \\[0, 1\\]"),
        ("1,2,a\n,3,b\n", 2, "label"),
        ("1,2,a\n1,nan,b\n", 2, "not a finite number"),
    ],
)
def test_malformed_line_names_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = _write(tmp_path, text)
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    with pytest.raises(DataFormatError, match=message) as info:
        _all(path, fmt)
    assert str(path) in str(info.value)
    assert f"line {line}:" in str(info.value)


def test_bad_hex_and_header_counted_in_line_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path, "label\tI1\tC1\n1\t2\tdeadbeef\n0\t1\tnothex\n", "data.tsv")
    fmt = DelimitedFormat(
        delimiter="\t",
        has_header=True,
        label_column="label",
        dense_columns=["I1"],
        categorical_columns=["C1"],
        categorical_encoding="hex32",
    )
    with pytest.raises(DataFormatError, match=r"line 3: column 'C1' \(index 2\).*nothex"):
        _all(path, fmt)
    wide = _write(tmp_path, "1\t2\t1deadbeef\n", "wide.tsv")
    no_header = DelimitedFormat(
        delimiter="\t",
        label_column=0,
        dense_columns=[1],
        categorical_columns=[2],
        categorical_encoding="hex32",
    )
    with pytest.raises(DataFormatError, match=r"line 1: .*32-bit"):
        _all(wide, no_header)


def test_skip_mode_skips_and_counts(tmp_path: Path, caplog) -> None:
    good = [f"{i % 2},{i},id{i}" for i in range(10)]
    lines = [*good[:3], "1,2", *good[3:6], "0,zz,a", "1,1,a,extra", *good[6:]]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    dataset = DelimitedDataset(
        path,
        fmt,
        num_embeddings=100,
        batch_size=4,
        split="all",
        drop_last=False,
        on_error="skip",
        max_skip_fraction=0.25,
    )
    batches = list(dataset)
    assert sum(len(b.labels) for b in batches) == 10
    assert torch.cat([b.dense_features[:, 0] for b in batches]).tolist() == pytest.approx(
        [math.log1p(i) for i in range(10)]
    )
    assert dataset.num_skipped == 3
    assert [line for line, _ in dataset.skipped] == [4, 8, 9]
    summary = dataset.skip_summary()
    assert "skipped 3 malformed lines of 13" in summary and "line 8" in summary
    assert dataset.num_lines == 13
    assert "skipped 3" in caplog.text
    list(dataset)
    assert dataset.num_skipped == 3  # counted per pass, not accumulated


def _skipping(path: Path, fmt: DelimitedFormat, **kwargs) -> DelimitedDataset:
    kwargs.setdefault("on_error", "skip")
    return DelimitedDataset(
        path, fmt, num_embeddings=100, batch_size=4, split="all", drop_last=False, **kwargs
    )


def test_skip_mode_refuses_a_file_whose_every_line_is_malformed(tmp_path: Path) -> None:
    path = _write(tmp_path, "".join(f"{i % 2};{i};id{i}\n" for i in range(7)))
    # A ';' file read as ',': one field per line; num_columns=3 keeps the expected layout.
    fmt = DelimitedFormat(
        label_column=0, dense_columns=[1], categorical_columns=[2], num_columns=3
    )
    dataset = _skipping(path, fmt, max_skip_fraction=1.0)
    with pytest.raises(DataFormatError) as info:
        list(dataset)
    message = str(info.value)
    assert str(path) in message
    assert "every one of its 7 data lines is malformed" in message
    assert "first bad line is line 1: expected 3 fields" in message


def test_skip_mode_refuses_more_than_max_skip_fraction(tmp_path: Path) -> None:
    lines = [f"{i % 2},{i},id{i}" for i in range(20)]
    lines[5] = "1,not-a-number,a"
    lines[12] = "1,2"
    path = _write(tmp_path, "\n".join(lines) + "\n")
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    with pytest.raises(DataFormatError) as info:
        list(_skipping(path, fmt))  # default max_skip_fraction: 1%, and 2 of 20 is 10%
    message = str(info.value)
    assert "skipped 2 of 20 data lines (10.0%), more than max_skip_fraction=0.01" in message
    assert "line 6: column index 1: cannot parse 'not-a-number'" in message
    assert "raise max_skip_fraction" in message
    batches = list(_skipping(path, fmt, max_skip_fraction=0.1))  # 10% is allowed by 0.1
    assert sum(len(b.labels) for b in batches) == 18


def test_max_skip_fraction_is_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "1,2,a\n")
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    for bad in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ConfigError, match="max_skip_fraction must be a number in"):
            _skipping(path, fmt, max_skip_fraction=bad)


@pytest.mark.parametrize(("batch_size", "world_size"), [(2, 3), (3, 2), (1, 4)])
def test_uneven_last_global_batch_is_split_evenly(
    tmp_path: Path, as_rows, batch_size: int, world_size: int
) -> None:
    path = _write(tmp_path, "".join(f"{i % 2},{i},k{i}\n" for i in range(10)))
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    (whole,) = _all(path, fmt, batch_size=10)
    ranks = [
        _all(path, fmt, batch_size=batch_size, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    counts = {len(r) for r in ranks}
    assert counts == {math.ceil(10 / (batch_size * world_size))}
    interleaved = [b for index in range(len(ranks[0])) for b in (r[index] for r in ranks)]
    assert as_rows(interleaved) == as_rows([whole])
    last = [len(r[-1].labels) for r in ranks]
    assert max(last) - min(last) <= 1
    dropped = [
        _all(path, fmt, batch_size=batch_size, rank=r, world_size=world_size, drop_last=True)
        for r in range(world_size)
    ]
    assert all(len(r) == 10 // (batch_size * world_size) for r in dropped)


def test_split_fractions_zero_and_one(tmp_path: Path) -> None:
    path = _write(tmp_path, "".join(f"1,{i},k\n" for i in range(50)))
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    assert _all(path, fmt, split="val", val_fraction=0.0) == []
    assert sum(len(b.labels) for b in _all(path, fmt, split="val", val_fraction=1.0)) == 50
    assert _all(path, fmt, split="train", val_fraction=1.0) == []


def test_dataset_validation(tmp_path: Path) -> None:
    path = _write(tmp_path, "label,a,b\n1,2,x\n")
    fmt = DelimitedFormat(has_header=True, label_column="label", categorical_columns=["a", "b"])
    with pytest.raises(ConfigError, match="missing \\['b'\\]"):
        DelimitedDataset(path, fmt, num_embeddings={"a": 3}, batch_size=1)
    with pytest.raises(ConfigError, match="rank"):
        DelimitedDataset(path, fmt, num_embeddings=3, batch_size=1, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="split"):
        DelimitedDataset(path, fmt, num_embeddings=3, batch_size=1, split="test")
    with pytest.raises(ConfigError, match="does not exist"):
        DelimitedDataset(tmp_path / "nope.csv", fmt, num_embeddings=3, batch_size=1)
    missing = DelimitedFormat(has_header=True, label_column="label", categorical_columns=["zz"])
    with pytest.raises(DataFormatError, match="line 1: header has no column 'zz'"):
        DelimitedDataset(path, missing, num_embeddings=3, batch_size=1)


def test_wrong_encoding_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("1,1,caf\xe9\n".encode("latin-1"))
    fmt = DelimitedFormat(label_column=0, dense_columns=[1], categorical_columns=[2])
    with pytest.raises(DataFormatError, match="latin-1"):
        _all(path, fmt)
    latin = DelimitedFormat(
        label_column=0, dense_columns=[1], categorical_columns=[2], encoding="latin-1"
    )
    (batch,) = _all(path, latin)
    assert batch.sparse_features["C1"].values().tolist() == [zlib.crc32("caf\xe9".encode()) % 1000]


def _missing_fields_file(tmp_path: Path) -> Path:
    # line 2 has an empty dense value, line 3 an empty categorical value
    return _write(tmp_path, "1,3,7\n0,,8\n1,2,\n")


def _missing_format(**kwargs) -> DelimitedFormat:
    return DelimitedFormat(
        label_column=0,
        dense_columns=[1],
        categorical_columns=[2],
        categorical_encoding="int",
        dense_transform="none",
        **kwargs,
    )


def test_empty_fields_default_to_zero_and_an_empty_bag(tmp_path: Path) -> None:
    (batch,) = _all(_missing_fields_file(tmp_path), _missing_format(), num_embeddings=100)
    assert batch.dense_features[:, 0].tolist() == [3.0, 0.0, 2.0]
    assert batch.sparse_features["C1"].lengths().tolist() == [1, 1, 0]
    assert batch.sparse_features["C1"].values().tolist() == [7, 8]


def test_missing_dense_and_missing_id_are_used_for_empty_fields(tmp_path: Path) -> None:
    fmt = _missing_format(missing_dense=-1.5, missing_categorical="id:42")
    (batch,) = _all(_missing_fields_file(tmp_path), fmt, num_embeddings=100)
    assert batch.dense_features[:, 0].tolist() == [3.0, -1.5, 2.0]
    assert batch.sparse_features["C1"].lengths().tolist() == [1, 1, 1]
    assert batch.sparse_features["C1"].values().tolist() == [7, 8, 42]
    hexed = DelimitedFormat(
        label_column=0,
        dense_columns=[1],
        categorical_columns=[2],
        categorical_encoding="hex32",
        missing_categorical="id:ff",
    )
    (batch,) = _all(_write(tmp_path, "1,1,a\n0,1,\n", "hex.csv"), hexed, num_embeddings=100)
    assert batch.sparse_features["C1"].values().tolist() == [0xA, 0xFF % 100]


def test_missing_values_can_make_the_line_malformed(tmp_path: Path) -> None:
    path = _missing_fields_file(tmp_path)
    with pytest.raises(DataFormatError, match=r"line 2: column index 1: empty value where a num"):
        _all(path, _missing_format(missing_dense=None))
    strict = _missing_format(missing_categorical="error")
    with pytest.raises(DataFormatError, match=r"line 3: column index 2: empty value \(missing_"):
        _all(path, strict)
    dataset = _skipping(path, strict, max_skip_fraction=0.5)
    (batch,) = list(dataset)
    assert batch.sparse_features["C1"].values().tolist() == [7, 8]
    assert [line for line, _ in dataset.skipped] == [3]
