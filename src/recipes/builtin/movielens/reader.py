"""MovieLens ratings (the ml-latest-small layout) as a click-through-rate task.

``ratings.csv`` (``userId,movieId,rating,timestamp``) is joined with ``movies.csv``
(``movieId,title,genres``). A rating of 4 stars or more is a positive. Each rating becomes:

- sparse ``user`` and ``movie``: the raw ids mapped to contiguous indices (users in the order of
  their sorted ids among the ratings; movies in the order of their sorted ids in the catalogue,
  so a rating of a movie missing from the catalogue is malformed);
- sparse ``genres``: a bag of the movie's genres ("(no genres listed)" counts as a genre, so no
  bag is empty);
- sparse ``hour`` (0-23), ``weekday`` (Monday = 0) and ``year`` (years since the first rating),
  all in UTC;
- one dense feature: the timestamp scaled to [0, 1] over the data set.

The data set is small (about 100k ratings), so it is loaded whole; vocabulary sizes are read
from the files, never assumed. The reader batches a split of it like ``recipes.data.sharding``
says: same step count on every rank; the incomplete last step dropped (training) or served as a
smaller step (``drop_last=False``: validation scores every rating).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import numpy as np
import numpy.typing as npt

from recipes.click.batch import CTRBatch, make_ctr_batch
from recipes.data.reader import DataError, DataReader
from recipes.data.sharding import StepLayout

logger = logging.getLogger(__name__)

SPARSE_FEATURE_NAMES = ("user", "movie", "genres", "hour", "weekday", "year")
NUM_DENSE_FEATURES = 1
POSITIVE_RATING = 4.0

_SECONDS_PER_DAY = 86_400
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday.


@dataclass(frozen=True)
class MovieLensData:
    """All ratings as arrays, one entry per rating, with the vocabulary sizes of the features."""

    users: npt.NDArray[np.int64]
    movies: npt.NDArray[np.int64]
    hours: npt.NDArray[np.int64]
    weekdays: npt.NDArray[np.int64]
    years: npt.NDArray[np.int64]
    timestamps: npt.NDArray[np.int64]
    labels: npt.NDArray[np.float32]
    # The genre bag of catalogue movie m: genre_ids[genre_offsets[m]:genre_offsets[m + 1]].
    genre_ids: npt.NDArray[np.int64]
    genre_offsets: npt.NDArray[np.int64]
    vocab_sizes: dict[str, int]

    @property
    def num_ratings(self) -> int:
        return len(self.labels)

    def split(
        self, method: Literal["time", "random"], valid_fraction: float, seed: int = 0
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The (train, valid) rating indices, disjoint and covering every rating.

        ``"time"`` puts the latest ``valid_fraction`` of the ratings in the validation split,
        as a recommender is used: trained on the past, asked about the future.
        """
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"`valid_fraction` must be in (0, 1), but is {valid_fraction} instead.")
        if method == "time":
            order = np.argsort(self.timestamps, kind="stable")
        elif method == "random":
            order = np.random.default_rng(seed).permutation(self.num_ratings)
        else:
            raise ValueError(f"`method` must be 'time' or 'random', but is {method!r} instead.")
        num_train = self.num_ratings - round(self.num_ratings * valid_fraction)
        return np.sort(order[:num_train]).astype(np.int64), np.sort(order[num_train:]).astype(np.int64)


def load_movielens(path: str) -> MovieLensData:
    """Loads ``ratings.csv`` and ``movies.csv`` from the directory ``path`` (any fsspec URL)."""
    movie_ids, genre_lists = _read_movies(f"{path.rstrip('/')}/movies.csv")
    raw_users, raw_movies, ratings, timestamps = _read_ratings(f"{path.rstrip('/')}/ratings.csv", movie_ids)

    genre_names = sorted({genre for genres in genre_lists for genre in genres})
    genre_index = {name: i for i, name in enumerate(genre_names)}
    genre_ids = np.array([genre_index[g] for genres in genre_lists for g in genres], dtype=np.int64)
    genre_offsets = np.concatenate([[0], np.cumsum([len(genres) for genres in genre_lists])]).astype(np.int64)

    user_vocab, users = np.unique(raw_users, return_inverse=True)
    years = timestamps.astype("datetime64[s]").astype("datetime64[Y]").astype(np.int64) + 1970
    first_year = int(years.min())
    return MovieLensData(
        users=users.astype(np.int64),
        movies=np.searchsorted(movie_ids, raw_movies).astype(np.int64),
        hours=(timestamps // 3600) % 24,
        weekdays=(timestamps // _SECONDS_PER_DAY + _EPOCH_WEEKDAY) % 7,
        years=years - first_year,
        timestamps=timestamps,
        labels=(ratings >= POSITIVE_RATING).astype(np.float32),
        genre_ids=genre_ids,
        genre_offsets=genre_offsets,
        vocab_sizes={
            "user": len(user_vocab),
            "movie": len(movie_ids),
            "genres": len(genre_names),
            "hour": 24,
            "weekday": 7,
            "year": int(years.max()) - first_year + 1,
        },
    )


def _read_movies(path: str) -> tuple[npt.NDArray[np.int64], list[list[str]]]:
    """The catalogue's sorted movie ids and, in the same order, their genres."""
    genres_by_id: dict[int, list[str]] = {}
    for line_number, (movie_id, _title, genres) in _csv_rows(path, ("movieId", "title", "genres")):
        id_ = _parse(int, movie_id, "movieId", path, line_number)
        if id_ in genres_by_id:
            raise DataError(f"Line {line_number} of {path} is malformed: movieId {id_} appears twice.")
        genres_by_id[id_] = sorted(set(genres.split("|")))
    ids = sorted(genres_by_id)
    return np.array(ids, dtype=np.int64), [genres_by_id[i] for i in ids]


def _read_ratings(path: str, movie_ids: npt.NDArray[np.int64]) -> tuple[npt.NDArray[Any], ...]:
    known_movies = set(movie_ids.tolist())
    users, movies, ratings, timestamps = [], [], [], []
    for line_number, (user, movie, rating, timestamp) in _csv_rows(path, ("userId", "movieId", "rating", "timestamp")):
        users.append(_parse(int, user, "userId", path, line_number))
        movies.append(_parse(int, movie, "movieId", path, line_number))
        ratings.append(_parse(float, rating, "rating", path, line_number))
        timestamps.append(_parse(int, timestamp, "timestamp", path, line_number))
        if movies[-1] not in known_movies:
            raise DataError(f"Line {line_number} of {path} is malformed: movieId {movies[-1]} is not in movies.csv.")
    if not users:
        raise DataError(f"{path} must hold at least one rating, but holds none instead.")
    return (
        np.array(users, dtype=np.int64),
        np.array(movies, dtype=np.int64),
        np.array(ratings, dtype=np.float64),
        np.array(timestamps, dtype=np.int64),
    )


def _csv_rows(path: str, header: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """The data rows of a csv file with their line numbers, checked against ``header``."""
    try:
        with fsspec.open(path, "rt", encoding="utf-8", newline="") as file:
            reader = csv.reader(file)
            found = tuple(next(reader, ()))
            if found != header:
                raise DataError(f"The header of {path} must be {','.join(header)}, but is {found} instead.")
            for row in reader:
                if len(row) != len(header):
                    raise DataError(
                        f"Line {reader.line_num} of {path} is malformed: it must have {len(header)} "
                        f"fields, but has {len(row)} instead."
                    )
                yield reader.line_num, row
    except FileNotFoundError as error:
        raise DataError(f"{path} must exist, but is missing instead.") from error


def _parse(kind: type[int] | type[float], text: str, column: str, path: str, line_number: int) -> Any:
    """``text`` as a number; ``float()`` also reads ``nan`` and ``inf``, which would train on garbage
    (a NaN rating is no click and no non-click), so they are malformed rows too."""
    try:
        value = kind(text)
    except ValueError:
        raise DataError(
            f"Line {line_number} of {path} is malformed: `{column}` must be a {kind.__name__}, but is {text!r} instead."
        ) from None
    if not math.isfinite(value):
        raise DataError(
            f"Line {line_number} of {path} is malformed: `{column}` must be a finite number, but is {text!r} instead."
        )
    return value


class MovieLensReader(DataReader[CTRBatch]):
    """Serves the ratings ``rows`` (e.g. one split) of ``data``, reshuffled every epoch.

    Rows are dealt to ranks as ``recipes.data.sharding`` says, a contract that whatever gathers
    per-row outputs relies on: over an epoch, the ``p``-th rating of the epoch's order (``rows``
    itself without ``shuffle``) is rank ``p % dp_size``'s ``p // dp_size``-th.

    ``drop_last=True`` (training) drops the ratings that fill no whole global step and logs how
    many when the epoch ends; ``drop_last=False`` (validation, which scores every rating) serves
    them as a last, smaller step, in which a rank they do not reach reads batches of zero rows.
    """

    def __init__(
        self,
        data: MovieLensData,
        rows: npt.NDArray[np.int64],
        *,
        batch_size: int,
        num_accumulate: int = 1,
        dp_rank: int = 0,
        dp_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        self._data = data
        self._rows = np.asarray(rows, dtype=np.int64)
        self._layout = StepLayout(batch_size, num_accumulate, dp_rank, dp_size, drop_last)
        self._shuffle = shuffle
        self._seed = seed
        self._num_steps = self._layout.num_steps(len(self._rows))
        first, last = int(data.timestamps.min()), int(data.timestamps.max())
        self._scaled_time = ((data.timestamps - first) / max(last - first, 1)).astype(np.float32)
        self._epoch = 0
        self._step = 0
        self._start_epoch()

    @property
    def num_steps_per_epoch(self) -> int:
        return self._num_steps

    def _start_epoch(self) -> None:
        if self._shuffle:
            self._order = self._rows[np.random.default_rng([self._seed, self._epoch]).permutation(len(self._rows))]
        else:
            self._order = self._rows
        self._drop_logged = False

    def __next__(self) -> list[CTRBatch]:
        if self._step >= self._num_steps:
            if not self._drop_logged:
                self._drop_logged = True
                self._layout.log_dropped_rows(logger, self._epoch, self._layout.num_dropped_rows(len(self._rows)))
            raise StopIteration
        step_rows = self._layout.rows_per_global_step
        global_rows = self._order[self._step * step_rows : (self._step + 1) * step_rows]
        self._step += 1
        return [self._make_batch(rows) for rows in self._layout.rank_rows(global_rows)]

    def _make_batch(self, rows: npt.NDArray[np.int64]) -> CTRBatch:
        data = self._data
        singles = np.arange(len(rows) + 1, dtype=np.int64)
        movies = data.movies[rows]
        bag_starts = data.genre_offsets[movies]
        bag_sizes = data.genre_offsets[movies + 1] - bag_starts
        bag_offsets = np.concatenate([[0], np.cumsum(bag_sizes)]).astype(np.int64)
        genre_positions = np.repeat(bag_starts - bag_offsets[:-1], bag_sizes) + np.arange(bag_offsets[-1])
        sparse = {
            "user": (data.users[rows], singles),
            "movie": (movies, singles),
            "genres": (data.genre_ids[genre_positions], bag_offsets),
            "hour": (data.hours[rows], singles),
            "weekday": (data.weekdays[rows], singles),
            "year": (data.years[rows], singles),
        }
        return make_ctr_batch(self._scaled_time[rows, None], sparse, data.labels[rows])

    def reset(self) -> None:
        self._epoch += 1
        self._step = 0
        self._start_epoch()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "step": self._step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._epoch = int(state_dict["epoch"])
        self._step = int(state_dict["step"])
        self._start_epoch()
