"""MovieLens-1M ratings joined with its user and movie tables, as click data.

ML-1M ships three ``::``-separated files: ``ratings.dat`` (``user::movie::rating::
timestamp``), ``users.dat`` (``user::gender::age::occupation::zip``) and ``movies.dat``
(``movie::title (year)::genre|genre|...``, latin-1). A rating file alone gives a model two
features; joined with the other two, every rating becomes an example of eight
categorical features (``user, movie, gender, age, occupation, zip, year, genres``,
genres multi-hot) whose label is a click when the rating is at least 4, the usual
reading of MovieLens as CTR data.

Every feature's rows are its vocabulary, read from the user and movie tables (sorted
distinct values, so the same files give the same rows on every rank): no hashing, no
collisions, and the tables are exactly as large as the data needs. The join needs the
whole user and movie tables in memory, and the ratings are read at once too (a million
ratings are tens of MB); the train/validation split is the same stable hash of the
rating's line index as :class:`~lightning_embark.data.DelimitedDataset`'s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset
from torchrec.datasets.utils import Batch

from lightning_embark.data._columns import Columns, check_sharding, rank_batches
from lightning_embark.data._hashing import in_split
from lightning_embark.data._spec import DEFAULT_EMBEDDING_DIM, ctr_spec
from lightning_embark.errors import ConfigError, DataFormatError
from lightning_embark.spec import ModelSpec

#: The features of every example, in KeyedJaggedTensor order.
MOVIELENS_FEATURES = ("user", "movie", "gender", "age", "occupation", "zip", "year", "genres")
#: A rating of at least this is a click.
DEFAULT_CLICK_RATING = 4.0
_SPLITS = ("train", "val", "all")
_YEAR = re.compile(r"\((\d{4})\)\s*$")


def _records(path: Path, fields: int, encoding: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of every non-blank line of a ``::`` file.

    Raises:
        DataFormatError: a line without ``fields`` fields, or text not in ``encoding``.
    """
    try:
        with path.open("r", encoding=encoding) as handle:
            for number, line in enumerate(handle, 1):
                line = line.rstrip("\r\n")
                if not line:
                    continue
                parts = line.split("::")
                if len(parts) != fields:
                    raise DataFormatError(
                        f"{path}, line {number}: expected {fields} fields separated by '::', "
                        f"got {len(parts)}"
                    )
                yield number, parts
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{path}: text is not valid {encoding} ({error.reason})") from error


def _vocabulary(values: Sequence[str]) -> dict[str, int]:
    """Row of every distinct value: its position among the sorted distinct values."""
    return {v: i for i, v in enumerate(sorted(set(values)))}


@dataclass(frozen=True, kw_only=True)
class _Tables:
    """The user and movie tables as rows of every feature."""

    users: dict[int, int]  # user id -> position
    movies: dict[int, int]  # movie id -> position
    user_rows: np.ndarray  # [users, 5]: user, gender, age, occupation, zip rows
    movie_rows: np.ndarray  # [movies, 2]: movie, year rows (-1: no year)
    genre_offsets: np.ndarray  # [movies + 1]
    genre_rows: np.ndarray
    sizes: dict[str, int]


def _read_tables(users_path: Path, movies_path: Path) -> _Tables:
    users = list(_records(users_path, 5, "utf-8"))
    movies = list(_records(movies_path, 3, "latin-1"))
    try:
        user_ids = [int(f[0]) for _, f in users]
        movie_ids = [int(f[0]) for _, f in movies]
    except ValueError as error:
        raise DataFormatError(
            f"{users_path} / {movies_path}: a user or movie id is not an integer ({error})"
        ) from error
    for path, ids in ((users_path, user_ids), (movies_path, movie_ids)):
        if len(set(ids)) != len(ids):
            raise DataFormatError(f"{path}: an id appears on two lines; the table must be unique")
    columns = [_vocabulary([f[c] for _, f in users]) for c in (1, 2, 3, 4)]
    user_rows = np.array(
        [[i] + [columns[c][f[c + 1]] for c in range(4)] for i, (_, f) in enumerate(users)],
        dtype=np.int64,
    ).reshape(-1, 5)
    years = [m.group(1) if (m := _YEAR.search(f[1])) else "" for _, f in movies]
    year_vocab = _vocabulary([y for y in years if y])
    genres = [[g for g in f[2].split("|") if g] for _, f in movies]
    genre_vocab = _vocabulary([g for bag in genres for g in bag])
    movie_rows = np.array(
        [[i, year_vocab[y] if y else -1] for i, y in enumerate(years)], dtype=np.int64
    ).reshape(-1, 2)
    lengths = np.array([len(b) for b in genres], dtype=np.int64)
    sizes = dict(
        zip(
            MOVIELENS_FEATURES,
            [len(users), len(movies), *(len(c) for c in columns), len(year_vocab)],
            strict=False,
        )
    )
    sizes["genres"] = len(genre_vocab)
    return _Tables(
        users={u: i for i, u in enumerate(user_ids)},
        movies={m: i for i, m in enumerate(movie_ids)},
        user_rows=user_rows,
        movie_rows=movie_rows,
        genre_offsets=np.concatenate(([0], np.cumsum(lengths))),
        genre_rows=np.array([genre_vocab[g] for bag in genres for g in bag], dtype=np.int64),
        sizes={f: max(1, sizes[f]) for f in MOVIELENS_FEATURES},
    )


class MovieLensDataset(IterableDataset[Batch]):
    """MovieLens-1M ratings joined with users and movies, as per-rank torchrec batches
    (``DataLoader(dataset, batch_size=None)``; see the module docstring).

    Args:
        ratings: ``ratings.dat`` (``user::movie::rating::timestamp``), or a sample of it.
        users: ``users.dat`` (``user::gender::age::occupation::zip``).
        movies: ``movies.dat`` (``movie::title (year)::genres``, latin-1).
        batch_size: Examples per batch on this rank.
        split: ``"train"``, ``"val"`` or ``"all"``.
        val_fraction: Share of ratings in ``val``, by a stable hash of (seed, line index).
        seed: Seed of the split.
        rank: This rank, in ``[0, world_size)``.
        world_size: Number of ranks sharing the stream.
        drop_last: Drop an incomplete final global batch.
        click_rating: A rating of at least this is a click (label 1).

    Raises:
        ConfigError: a file is missing or an option is out of range.
        DataFormatError: a malformed line, or a rating of a user or movie the tables
            do not have (the file and line named).
    """

    def __init__(
        self,
        ratings: str | Path,
        users: str | Path,
        movies: str | Path,
        *,
        batch_size: int,
        split: str = "train",
        val_fraction: float = 0.2,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        click_rating: float = DEFAULT_CLICK_RATING,
    ) -> None:
        super().__init__()
        check_sharding(batch_size=batch_size, rank=rank, world_size=world_size)
        if split not in _SPLITS:
            raise ConfigError(f"split must be one of {_SPLITS}, got {split!r}")
        if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction <= 1.0:
            raise ConfigError(f"val_fraction must be in [0, 1], got {val_fraction!r}")
        self.paths = tuple(Path(p) for p in (ratings, users, movies))
        for what, path in zip(("ratings", "users", "movies"), self.paths, strict=True):
            if not path.is_file():
                raise ConfigError(f"MovieLens {what} file {str(path)!r} does not exist")
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.split, self.val_fraction, self.seed = split, float(val_fraction), seed
        self.drop_last, self.click_rating = drop_last, float(click_rating)
        self._tables = _read_tables(self.paths[1], self.paths[2])
        self._columns = self._join()

    @property
    def feature_names(self) -> list[str]:
        """KeyedJaggedTensor keys, in order."""
        return list(MOVIELENS_FEATURES)

    @property
    def table_rows(self) -> dict[str, int]:
        """Feature -> rows of its table (its vocabulary's size), in feature order."""
        return dict(self._tables.sizes)

    def model_spec(self, embedding_dim: int = DEFAULT_EMBEDDING_DIM) -> ModelSpec:
        """One ``embedding_dim``-wide table per feature, sized to its vocabulary; no dense
        features. ``genres``' pooling factor is its mean bag size over the ratings."""
        spec = ctr_spec(
            self.table_rows,
            num_dense_features=0,
            embedding_dim=embedding_dim,
            name="movielens-1m",
            source=f"{self.paths[0]} joined with {self.paths[1].name}, {self.paths[2].name}",
        )
        genres = float(self._columns.lengths[-1].mean()) if self._columns.num_rows else 1.0
        tables = tuple(
            dataclasses.replace(t, pooling_factor=genres) if t.name == "genres" else t
            for t in spec.tables
        )
        return dataclasses.replace(spec, tables=tables)

    def _join(self) -> Columns:
        """Every rating of the split as one block of joined columns."""
        path, tables = self.paths[0], self._tables
        users, movies, labels = [], [], []
        for number, fields in _records(path, 4, "utf-8"):
            try:
                user, movie, rating = int(fields[0]), int(fields[1]), float(fields[2])
            except ValueError as error:
                raise DataFormatError(f"{path}, line {number}: {error}") from error
            if user not in tables.users or movie not in tables.movies:
                which = "user" if user not in tables.users else "movie"
                raise DataFormatError(
                    f"{path}, line {number}: {which} {user if which == 'user' else movie} is "
                    f"not in the {which}s table ({self.paths[1 if which == 'user' else 2]})"
                )
            users.append(tables.users[user])
            movies.append(tables.movies[movie])
            labels.append(rating >= self.click_rating)
        keep = in_split(
            self.split,
            seed=self.seed,
            val_fraction=self.val_fraction,
            first_index=0,
            count=len(labels),
        )
        u = np.asarray(users, dtype=np.int64)[keep]
        m = np.asarray(movies, dtype=np.int64)[keep]
        ones = np.ones(len(u), dtype=np.int64)
        user_rows, movie_rows = tables.user_rows[u], tables.movie_rows[m]
        year = movie_rows[:, 1]
        starts, stops = tables.genre_offsets[m], tables.genre_offsets[m + 1]
        genre_lengths = stops - starts
        genre_values = tables.genre_rows[
            np.concatenate([np.arange(a, b) for a, b in zip(starts, stops, strict=True)])
            if len(m)
            else np.zeros(0, dtype=np.int64)
        ]
        lengths = [ones] * 6 + [(year >= 0).astype(np.int64), genre_lengths]
        # user, movie, gender, age, occupation, zip, year, genres
        values = [user_rows[:, 0], movie_rows[:, 0], *(user_rows[:, c] for c in range(1, 5))]
        values += [year[year >= 0], genre_values]
        return Columns(
            dense=np.zeros((len(u), 0), dtype=np.float32),
            labels=np.asarray(labels, dtype=np.float32)[keep],
            lengths=tuple(lengths),
            values=tuple(values),
        )

    def __iter__(self) -> Iterator[Batch]:
        return rank_batches(
            [self._columns],
            keys=self.feature_names,
            batch_size=self.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )
