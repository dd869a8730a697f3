"""libFM input: the ``libfm`` categorical encoding and :func:`libfm_format`, read by
DelimitedDataset, on small inline files and on the real Frappe file."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lightning_embark.data import DelimitedDataset, libfm_format
from lightning_embark.errors import ConfigError, DataFormatError

FRAPPE = "frappe-nfm-validation.libfm"
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


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.libfm"
    path.write_bytes(text.encode())
    return path


def _all(path: Path, fields, rows: int = 100, **kwargs) -> list:
    return list(
        DelimitedDataset(
            path,
            libfm_format(fields, **kwargs),
            num_embeddings=rows,
            batch_size=4,
            split="all",
            drop_last=False,
        )
    )


def test_fields_by_position_labels_thresholded(tmp_path: Path, as_rows) -> None:
    """The k-th pair is field k; its index is the ID; 1 / -1 / 0 labels read as 1 / 0 / 0;
    CRLF line ends (as Frappe's files have) and ``index:1.0`` are accepted."""
    path = _write(tmp_path, "1 3:1 17:1\r\n-1 4:1 18:1.0\r\n0 5:1 19:1\r\n")
    (batch,) = _all(path, ["a", "b"])
    assert batch.sparse_features.keys() == ["a", "b"]
    assert as_rows([batch]) == [
        ((), 1.0, ((3,), (17,))),
        ((), 0.0, ((4,), (18,))),
        ((), 0.0, ((5,), (19,))),
    ]


def test_indices_hash_into_smaller_tables(tmp_path: Path, as_rows) -> None:
    path = _write(tmp_path, "1 250:1 17:1\n")
    (batch,) = _all(path, 2, rows=100)
    assert batch.sparse_features.keys() == ["F1", "F2"]
    assert as_rows([batch]) == [((), 1.0, ((50,), (17,)))]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("1 3:0.5 4:1", "not a libFM one-hot pair"),
        ("1 3 4:1", "not a libFM one-hot pair"),
        ("1 x:1 4:1", "not a libFM one-hot pair"),
        ("1 -3:1 4:1", "not a libFM one-hot pair"),
        ("1 3:1", "expected 3 fields"),
    ],
)
def test_malformed_pairs_name_the_line(tmp_path: Path, line: str, why: str) -> None:
    path = _write(tmp_path, f"1 1:1 2:1\n{line}\n")
    with pytest.raises(DataFormatError, match=rf"line 2: .*{why}"):
        _all(path, 2)


def test_format_validation() -> None:
    with pytest.raises(ConfigError, match="at least one field"):
        libfm_format(0)
    with pytest.raises(ConfigError, match="unique"):
        libfm_format(["a", "a"])


def test_frappe_file(shared_file) -> None:
    """The real file: 57,722 lines of 10 one-hot fields, one positive per two negatives
    (the dataset's readme: 2 sampled negatives per positive), every field's IDs in a
    range of its own (its global libFM indices)."""
    path = shared_file(FRAPPE)
    batches = list(
        DelimitedDataset(
            path,
            libfm_format(FRAPPE_FIELDS),
            num_embeddings=5382,
            batch_size=8192,
            split="all",
            drop_last=False,
        )
    )
    labels = sum(float(b.labels.sum()) for b in batches)
    rows = sum(len(b.labels) for b in batches)
    assert rows == 57_722
    assert abs(labels / rows - 1 / 3) < 0.01
    ranges = []
    for name in FRAPPE_FIELDS:
        ids = [b.sparse_features[name] for b in batches]
        assert all(bool((j.lengths() == 1).all()) for j in ids)
        ranges.append(
            (min(int(j.values().min()) for j in ids), max(int(j.values().max()) for j in ids))
        )
    assert all(hi < lo for (_, hi), (lo, _) in itertools.pairwise(ranges))
