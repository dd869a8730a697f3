"""MovieLensDataset: the join of ratings with users and movies, on inline files and on
the real MovieLens-1M sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_embark.data import MOVIELENS_FEATURES, MovieLensDataset
from lightning_embark.errors import ConfigError, DataFormatError

RATINGS = "movielens-librec-ml-1m-ratings-100k.dat"
USERS = "movielens-srimatta-ml-1m-users.dat"
MOVIES = "movielens-srimatta-ml-1m-movies.dat"


def _files(tmp_path: Path, ratings: str) -> tuple[Path, Path, Path]:
    paths = (tmp_path / "ratings.dat", tmp_path / "users.dat", tmp_path / "movies.dat")
    paths[0].write_text(ratings)
    paths[1].write_text("1::F::1::10::48067\n2::M::56::16::70072\n3::M::25::15::55117\n")
    paths[2].write_bytes(
        "10::Toy Story (1995)::Animation|Children's|Comedy\n"
        "20::Am\xe9lie (2001)::Comedy|Romance\n"
        "30::Untitled::Drama\n".encode("latin-1")
    )
    return paths


def test_join_vocabularies_and_clicks(tmp_path: Path, as_rows) -> None:
    """Rows are vocabulary positions (sorted distinct values of the tables); genres are
    one bag; a movie without a year has an empty ``year`` bag; rating >= 4 is a click."""
    paths = _files(tmp_path, "2::20::5::1\n1::10::3::2\n3::30::4::3\n")
    data = MovieLensDataset(*paths, batch_size=8, split="all", drop_last=False)
    assert data.feature_names == list(MOVIELENS_FEATURES)
    assert data.table_rows == {
        "user": 3,
        "movie": 3,
        "gender": 2,
        "age": 3,
        "occupation": 3,
        "zip": 3,
        "year": 2,
        "genres": 5,
    }
    # genres sorted: Animation 0, Children's 1, Comedy 2, Drama 3, Romance 4; ages "1" 0,
    # "25" 1, "56" 2; occupations "10" 0, "15" 1, "16" 2; zips 48067 0, 55117 1, 70072 2.
    assert as_rows(list(data)) == [
        ((), 1.0, ((1,), (1,), (1,), (2,), (2,), (2,), (1,), (2, 4))),
        ((), 0.0, ((0,), (0,), (0,), (0,), (0,), (0,), (0,), (0, 1, 2))),
        ((), 1.0, ((2,), (2,), (1,), (1,), (1,), (1,), (), (3,))),
    ]
    spec = data.model_spec(8)
    assert [t.name for t in spec.tables] == list(MOVIELENS_FEATURES)
    assert spec.num_dense_features == 0
    assert spec.tables[-1].pooling_factor == pytest.approx(6 / 3)


def test_split_is_a_partition(tmp_path: Path, as_rows) -> None:
    lines = "".join(f"{1 + i % 3}::{10 * (1 + i % 3)}::{1 + i % 5}::{i}\n" for i in range(200))
    paths = _files(tmp_path, lines)

    def rows(split: str) -> int:
        data = MovieLensDataset(*paths, batch_size=16, split=split, drop_last=False)
        return sum(len(b.labels) for b in data)

    train, val = rows("train"), rows("val")
    assert train + val == 200
    assert 20 <= val <= 60  # 40 expected; the split is a hash, binomial sd ~5.7


@pytest.mark.parametrize(
    ("ratings", "message"),
    [
        ("1::10::5\n", "line 1: expected 4 fields"),
        ("1::10::5::1\n9::10::5::1\n", "line 2: user 9 is not in the users table"),
        ("1::99::5::1\n", "line 1: movie 99 is not in the movies table"),
        ("1::10::five::1\n", "line 1: could not convert"),
    ],
)
def test_malformed_ratings_name_the_line(tmp_path: Path, ratings: str, message: str) -> None:
    with pytest.raises(DataFormatError, match=message):
        MovieLensDataset(*_files(tmp_path, ratings), batch_size=4)


def test_options_are_checked(tmp_path: Path) -> None:
    paths = _files(tmp_path, "1::10::5::1\n")
    with pytest.raises(ConfigError, match="ratings file"):
        MovieLensDataset(tmp_path / "none.dat", *paths[1:], batch_size=4)
    with pytest.raises(ConfigError, match="split"):
        MovieLensDataset(*paths, batch_size=4, split="test")


def test_real_sample(shared_file) -> None:
    """The 100,000-rating ML-1M sample: every rating joins (6,040 users and 3,883 movies in
    the tables), 57,483 ratings are >= 4 (SOURCES.md), genres average 1.5-2.5 per rating."""
    paths = [shared_file(name) for name in (RATINGS, USERS, MOVIES)]
    data = MovieLensDataset(*paths, batch_size=8192, split="all", drop_last=False)
    batches = list(data)
    assert sum(len(b.labels) for b in batches) == 100_000
    assert int(sum(float(b.labels.sum()) for b in batches)) == 57_483
    assert data.table_rows["user"] == 6040 and data.table_rows["movie"] == 3883
    assert data.table_rows["genres"] == 18
    assert 1.5 < data.model_spec().tables[-1].pooling_factor < 2.5
