from __future__ import annotations

import csv
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from recipes.builtin.movielens.reader import MovieLensData, MovieLensReader, load_movielens
from recipes.builtin.movielens.recipe import SHIPPED_DATA
from recipes.click.batch import CTRBatch
from recipes.data.reader import DataError

SHIPPED = Path(SHIPPED_DATA)

MOVIES = """movieId,title,genres
10,"Heat, The (1995)",Action|Crime
2,Toy Story (1995),Comedy|Animation
7,Nothing (2000),(no genres listed)
"""
# 2001-09-09 01:46:40 UTC (a Sunday), 2001-09-10 13:00:00 UTC (a Monday), 2003-01-01 00:00:00 UTC.
RATINGS = """userId,movieId,rating,timestamp
5,10,4.0,1000000000
3,2,3.5,1000126800
5,7,5.0,1041379200
"""


def write_dataset(directory: Path, movies: str = MOVIES, ratings: str = RATINGS) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "movies.csv").write_text(movies)
    (directory / "ratings.csv").write_text(ratings)
    return str(directory)


def rows_of(steps: list[list[CTRBatch]]) -> list[list[list[int]]]:
    """Per step, per micro-batch, the (user, movie, year) triples flattened into row keys."""
    return [[(b.sparse["user"].ids * 1_000_000 + b.sparse["movie"].ids).tolist() for b in step] for step in steps]


def test_hand_written_files_give_exact_features(tmp_path: Path) -> None:
    data = load_movielens(write_dataset(tmp_path / "ml"))

    assert data.vocab_sizes == {"user": 2, "movie": 3, "genres": 5, "hour": 24, "weekday": 7, "year": 3}
    assert data.users.tolist() == [1, 0, 1]  # users 3 and 5
    assert data.movies.tolist() == [2, 0, 1]  # movies 2, 7, 10
    assert data.hours.tolist() == [1, 13, 0]
    assert data.weekdays.tolist() == [6, 0, 2]
    assert data.years.tolist() == [0, 0, 2]
    assert data.labels.tolist() == [1.0, 0.0, 1.0]

    reader = MovieLensReader(data, np.arange(3), batch_size=3, shuffle=False)
    [[batch]] = list(reader)
    # Genres sorted: (no genres listed)=0, Action=1, Animation=2, Comedy=3, Crime=4.
    assert batch.sparse["genres"].ids.tolist() == [1, 4, 2, 3, 0]
    assert batch.sparse["genres"].offsets.tolist() == [0, 2, 4, 5]
    assert batch.sparse["movie"].offsets.tolist() == [0, 1, 2, 3]
    span = 1041379200 - 1000000000
    torch.testing.assert_close(batch.dense[:, 0], torch.tensor([0.0, 126800 / span, 1.0]))
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("ratings", "message"),
    [
        (
            "userId,movieId,rating,timestamp\n1,2,3.0\n",
            r"Line 2 of .*ratings.csv is malformed: it must have 4",
        ),
        ("userId,movieId,rating,timestamp\n1,2,3.0,5\n1,x,3.0,5\n", r"Line 3 .* `movieId` must be a int"),
        ("userId,movieId,rating,timestamp\n1,99,3.0,5\n", r"Line 2 .* movieId 99 is not in movies.csv"),
        ("user,movie,rating,timestamp\n", r"The header of .*ratings.csv must be"),
        ("userId,movieId,rating,timestamp\n", r"ratings.csv must hold at least one rating"),
    ],
)
def test_malformed_files_are_data_errors_naming_file_and_line(tmp_path: Path, ratings: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_movielens(write_dataset(tmp_path / "ml", ratings=ratings))


def test_missing_files_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"movies.csv must exist"):
        load_movielens(str(tmp_path / "nowhere"))


def test_memory_filesystem_paths() -> None:
    for name, text in (("movies.csv", MOVIES), ("ratings.csv", RATINGS)):
        with fsspec.open(f"memory://ml/{name}", "wt") as file:
            file.write(text)

    assert load_movielens("memory://ml").num_ratings == 3


@pytest.fixture(scope="module")
def shipped() -> MovieLensData:
    return load_movielens(str(SHIPPED))


def test_shipped_data_vocabularies_come_from_the_files(shipped: MovieLensData) -> None:
    with open(SHIPPED / "ratings.csv", newline="") as file:
        ratings = list(csv.DictReader(file))
    with open(SHIPPED / "movies.csv", newline="") as file:
        movies = list(csv.DictReader(file))

    assert shipped.num_ratings == len(ratings)
    assert shipped.vocab_sizes["user"] == len({r["userId"] for r in ratings})
    assert shipped.vocab_sizes["movie"] == len({m["movieId"] for m in movies})
    assert shipped.vocab_sizes["genres"] == len({g for m in movies for g in m["genres"].split("|")})
    for name, size in shipped.vocab_sizes.items():
        ids = {"user": shipped.users, "movie": shipped.movies, "genres": shipped.genre_ids}.get(name)
        if ids is not None:
            assert ids.min() >= 0 and ids.max() < size
    assert 0.4 < shipped.labels.mean() < 0.6


@pytest.mark.parametrize("method", ["time", "random"])
def test_splits_are_disjoint_and_cover_every_rating(shipped: MovieLensData, method: str) -> None:
    train, valid = shipped.split(method, valid_fraction=0.2, seed=1)  # type: ignore[arg-type]

    assert len(np.intersect1d(train, valid)) == 0
    assert np.array_equal(np.sort(np.concatenate([train, valid])), np.arange(shipped.num_ratings))
    assert len(valid) == round(shipped.num_ratings * 0.2)
    if method == "time":
        assert shipped.timestamps[train].max() <= shipped.timestamps[valid].min()
    else:
        assert np.array_equal(valid, shipped.split("random", valid_fraction=0.2, seed=1)[1])


def test_two_ranks_share_every_row_once_with_equal_step_counts(shipped: MovieLensData) -> None:
    rows = np.arange(1000)

    def read(rank: int) -> list[list[CTRBatch]]:
        reader = MovieLensReader(shipped, rows, batch_size=16, num_accumulate=3, dp_rank=rank, dp_size=2, seed=4)
        return list(reader)

    rank_0, rank_1 = read(0), read(1)
    assert len(rank_0) == len(rank_1) == 1000 // 96
    keys = [k for rank in (rank_0, rank_1) for step in rows_of(rank) for batch in step for k in batch]
    expected = (shipped.users[:1000] * 1_000_000 + shipped.movies[:1000]).tolist()
    assert len(keys) == 960
    assert set(keys) <= set(expected)
    assert len(set(keys)) == len(keys) == len(set(keys) & set(expected))


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_reads_what_an_uninterrupted_run_reads(shipped: MovieLensData, shuffle: bool) -> None:
    def reader() -> MovieLensReader:
        return MovieLensReader(shipped, np.arange(500, 900), batch_size=8, num_accumulate=2, shuffle=shuffle)

    uninterrupted = reader()
    uninterrupted.reset()
    expected = rows_of(list(uninterrupted))

    interrupted = reader()
    interrupted.reset()
    head = rows_of([next(interrupted) for _ in range(7)])
    resumed = reader()
    resumed.load_state_dict(interrupted.state_dict())

    assert head + rows_of(list(resumed)) == expected
    first_epoch = rows_of(list(reader()))
    assert (first_epoch != expected) == shuffle
